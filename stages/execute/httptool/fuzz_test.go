package httptool

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzURLTemplate: whatever the parameters hold, an expanded URL keeps the
// template's scheme, host and port, its fixed path segments, and puts each
// parameter in one path segment or one query value.
func FuzzURLTemplate(f *testing.F) {
	for _, s := range [][2]string{{"42", "shoes"}, {"a/../../x?y=1#z", "a&b=c#d e"}, {"..", ""}, {"%2e%2e", "%00"},
		{"@evil.example", "//evil.example"}, {"\\..\\", "\r\nHost: x"}, {"", ""}} {
		f.Add(s[0], s[1])
	}
	tpl, err := parseURLTemplate("https://api.example.com:8443/v1/items/{{id}}/detail?q={{q}}&fixed=1")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, q string) {
		params := map[string]json.RawMessage{}
		for k, v := range map[string]string{"id": id, "q": q} {
			b, _ := json.Marshal(v)
			params[k] = b
		}
		u, err := tpl.expand(params)
		if err != nil {
			return // refused, which is allowed
		}
		if u.Scheme != "https" || u.Host != "api.example.com:8443" || u.User != nil || u.Fragment != "" {
			t.Fatalf("parameters moved the URL's origin: %s", u)
		}
		segs := strings.Split(u.EscapedPath(), "/")
		if len(segs) != 5 || segs[1] != "v1" || segs[2] != "items" || segs[4] != "detail" {
			t.Fatalf("parameters changed the path's shape: %q", u.EscapedPath())
		}
		query := u.Query()
		if len(query) != 2 || query.Get("fixed") != "1" || len(query["q"]) != 1 {
			t.Fatalf("parameters changed the query's shape: %q", u.RawQuery)
		}
		if query.Get("q") != jsonString(q) {
			t.Fatalf("q arrived as %q, sent %q", query.Get("q"), q)
		}
	})
}

// jsonString is s as it survives a JSON round trip (invalid UTF-8 becomes
// U+FFFD).
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	var out string
	_ = json.Unmarshal(b, &out)
	return out
}
