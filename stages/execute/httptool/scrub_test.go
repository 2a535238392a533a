package httptool

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// scrubCase is one line of testdata/scrub.jsonl: a stored credential and
// what a server answers a call that sent it. A hostile answer holds the
// credential in some form, none of leak may reach the caller and it must be
// redacted; a benign one (benign) must reach the caller unchanged.
type scrubCase struct {
	Note   string          `json:"note"`
	Secret string          `json:"secret"`
	JSON   bool            `json:"json"`
	Benign bool            `json:"benign"`
	Output json.RawMessage `json:"output"`
	Leak   []string        `json:"leak"`
}

func readScrubCases(t testing.TB) []scrubCase {
	t.Helper()
	f, err := os.Open("testdata/scrub.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []scrubCase
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var c scrubCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("scrub.jsonl:%d: %v", n, err)
		}
		out = append(out, c)
	}
	return out
}

// body is what the server sends for c: the JSON document, or the text.
func (c scrubCase) body() string {
	if c.JSON {
		return string(c.Output)
	}
	var s string
	_ = json.Unmarshal(c.Output, &s)
	return s
}

// TestScrubTransformedCredentials: a stored credential echoed back reversed,
// spaced, grouped, in another case, split across lines, JSON members or
// items, or base64 or hex encoded (alone or inside a longer text) is
// redacted from what the call returns; outputs that do not hold it pass
// unchanged. Each case goes through a real call: the credential injected
// into the request, the server's answer scrubbed as a text or JSON body.
func TestScrubTransformedCredentials(t *testing.T) {
	cases := readScrubCases(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		c := cases[i]
		if r.Header.Get("Authorization") != "Bearer "+c.Secret {
			w.WriteHeader(401)
			return
		}
		if c.JSON {
			w.Header().Set("Content-Type", "application/json")
		} else {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		}
		_, _ = w.Write([]byte(c.body()))
	}))
	defer srv.Close()
	var hostile, caught, benign, intact int
	for i, c := range cases {
		k := New(Config{Secrets: staticSecrets{"api_key": c.Secret}})
		m := manifest(t, `{"url":"`+srv.URL+`/`+strconv.Itoa(i)+`","credentials":[{"secret":"api_key","header":"Authorization","prefix":"Bearer "}]}`,
			`{"credentials":["api_key"]}`)
		res, err := run(t, k, m, local, `{}`)
		if err != nil || res["status"] != float64(200) {
			t.Fatalf("%s: %v %v", c.Note, err, res)
		}
		got, _ := json.Marshal(res["body"])
		if c.Benign {
			benign++
			var want any = c.body()
			if c.JSON {
				_ = json.Unmarshal(c.Output, &want)
			}
			if reflect.DeepEqual(res["body"], want) {
				intact++
			} else {
				t.Errorf("benign %q changed: %s", c.Note, got)
			}
			continue
		}
		hostile++
		ok := strings.Contains(string(got), Redacted)
		for _, l := range append(c.Leak, c.Secret) {
			if strings.Contains(string(got), l) {
				ok = false
				t.Errorf("%s: %q reached the caller: %s", c.Note, l, got)
			}
		}
		if ok {
			caught++
		} else if !strings.Contains(string(got), Redacted) {
			t.Errorf("%s: nothing redacted: %s", c.Note, got)
		}
	}
	t.Logf("stored credentials: %d/%d transformed forms redacted, %d/%d benign outputs intact", caught, hostile, intact, benign)
	if hostile < 20 || benign < 8 {
		t.Fatalf("the corpus holds %d hostile and %d benign cases", hostile, benign)
	}
}

// TestScrubJSONKeepsTypes: scrubbing a decoded document gives back plain
// strings, maps and slices, whether or not anything was redacted.
func TestScrubJSONKeepsTypes(t *testing.T) {
	s := newScrubber("ghp_8rESQedUStPKR0CsTy4Qwb8DwkNhFdnXsiVp")
	for _, doc := range []string{`"one"`, `{"a":"one"}`, `{"a":"one","b":["two",3]}`, `{"a":"ghp_8rESQedUSt","b":["PKR0CsTy4Qwb8DwkNhFdnXsiVp",3]}`} {
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		var walk func(any)
		walk = func(x any) {
			switch t2 := x.(type) {
			case map[string]any:
				for _, y := range t2 {
					walk(y)
				}
			case []any:
				for _, y := range t2 {
					walk(y)
				}
			case string, float64, bool, nil, json.Number:
			default:
				t.Errorf("%s: scrubbed into a %T", doc, x)
			}
		}
		walk(s.JSON(v))
	}
}

// FuzzScrub: whatever a server answers, the scrubber never lets the
// credential itself through, and changes nothing of an answer that holds
// none of its exact forms nor its letters and digits in order.
func FuzzScrub(f *testing.F) {
	for _, c := range readScrubCases(f) {
		f.Add(c.Secret, c.body())
	}
	f.Fuzz(func(t *testing.T, secret, text string) {
		s := newScrubber(secret)
		out := s.String(text)
		if secret != "" && strings.Contains(out, secret) && !strings.Contains(Redacted, secret) {
			t.Fatalf("%q still holds %q", out, secret)
		}
		if sk := skeleton(secret); len(sk) >= minSkeleton && s.r.Replace(text) == text &&
			!containsInOrder(skeleton(text), sk) && out != text {
			t.Fatalf("%q changed to %q though it holds nothing of %q", text, out, secret)
		}
		var v any
		if json.Unmarshal([]byte(text), &v) == nil {
			_ = s.JSON(v)
		}
	})
}

// containsInOrder reports whether every byte of sub shows in s in order
// (not necessarily adjacent), forwards or reversed.
func containsInOrder(s, sub []byte) bool {
	fwd := func(sub []byte) bool {
		j := 0
		for i := 0; i < len(s) && j < len(sub); i++ {
			if s[i] == sub[j] {
				j++
			}
		}
		return j == len(sub)
	}
	rev := append([]byte(nil), sub...)
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return fwd(sub) || fwd(rev)
}
