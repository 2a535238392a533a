package hosts

import "testing"

func TestMatch(t *testing.T) {
	cases := []struct {
		pattern, host string
		want          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"API.example.com", "api.EXAMPLE.com", true},
		{"api.example.com", "example.com", false},
		{"*.example.com", "api.example.com", true},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com", "evilexample.com", false},
		{"*.example.com", "example.com.evil.org", false},
		{"example.com", "api.example.com", false},
		{"*", "anything", false},
	}
	for _, c := range cases {
		t.Run(c.pattern+" "+c.host, func(t *testing.T) {
			if got := Match(c.pattern, c.host); got != c.want {
				t.Fatalf("Match(%q, %q) = %v", c.pattern, c.host, got)
			}
		})
	}
	if !Any([]string{"a.org", "*.example.com"}, "x.example.com") || Any([]string{"a.org"}, "b.org") || Any(nil, "a.org") {
		t.Fatal("Any does not follow Match")
	}
}
