package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"runtime"
	"strings"
	"testing"
	"time"
)

func textParams(s string) json.RawMessage { return mustJSON(map[string]string{"text": s}) }

func TestParseJSON(t *testing.T) {
	cases := []struct{ text, want string }{
		{`{"a":[1,2.5,null,true],"b":{"c":"d"}}`, `{"value":{"a":[1,2.5,null,true],"b":{"c":"d"}}}`},
		{` 12345678901234567890123 `, `{"value":12345678901234567890123}`},
		{`"x"`, `{"value":"x"}`},
		{`null`, `{"value":null}`},
		{strings.Repeat("[", maxParseDepth) + strings.Repeat("]", maxParseDepth), `{"value":` + strings.Repeat("[", maxParseDepth) + strings.Repeat("]", maxParseDepth) + `}`},
	}
	for _, c := range cases {
		out, err := parseJSON(context.Background(), textParams(c.text))
		if err != nil || string(out) != c.want {
			t.Fatalf("%s: %s %v, want %s", c.text, out, err, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1}{"b":2}`, `[1,]`, `1 2`, `{"a":1}x`, `NaN`} {
		_, err := parseJSON(context.Background(), textParams(bad))
		wantCode(t, bad, err, api.InvalidParameters, api.EParametersInvalid)
	}
	deep := strings.Repeat("[", maxParseDepth+1) + strings.Repeat("]", maxParseDepth+1)
	_, err := parseJSON(context.Background(), textParams(deep))
	wantCode(t, "too deep", err, api.InvalidParameters, api.EParameterBounds)
	_, err = parseJSON(context.Background(), textParams(`"`+strings.Repeat("x", maxParseBytes)+`"`))
	wantCode(t, "too long", err, api.InvalidParameters, api.EParameterBounds)
	_, err = parseJSON(context.Background(), json.RawMessage(`{}`))
	wantCode(t, "no text", err, api.InvalidParameters, api.EParametersInvalid)
}

func TestParseYAML(t *testing.T) {
	cases := []struct{ text, want string }{
		{"a: 1\nb: [x, 2.5, true, null]\n", `{"value":{"a":1,"b":["x",2.5,true,null]}}`},
		{"- &x {k: v}\n- *x\n", `{"value":[{"k":"v"},{"k":"v"}]}`},
		{"base: &b {x: 1}\nderived:\n  <<: *b\n  y: 2\n", `{"value":{"base":{"x":1},"derived":{"x":1,"y":2}}}`},
		{"1: one\ntrue: yes\n", `{"value":{"1":"one","true":"yes"}}`},
		{"t: 2020-01-02T03:04:05Z\n", `{"value":{"t":"2020-01-02T03:04:05Z"}}`},
		{"", `{"value":null}`},
		{"plain text", `{"value":"plain text"}`},
		{"n: 18446744073709551615\n", `{"value":{"n":18446744073709551615}}`},
	}
	for _, c := range cases {
		out, err := parseYAML(context.Background(), textParams(c.text))
		if err != nil || string(out) != c.want {
			t.Fatalf("%q: %s %v, want %s", c.text, out, err, c.want)
		}
	}
	for _, bad := range []string{
		"a: [1, 2",             // syntax
		"a: 1\n---\nb: 2\n",    // two documents
		"a: *nope\n",           // unknown anchor
		"x: .inf\n",            // no JSON form
		"? [1, 2]\n: v\n",      // a sequence as a key
		"&a [*a]\n",            // an alias inside its own anchor
		"a: &a {b: *a}\n",      // the same, in a mapping
		"1: a\n\"1\": b\n",     // keys colliding once they are strings
		"a: !!binary \"!!\"\n", // bad base64
	} {
		_, err := parseYAML(context.Background(), textParams(bad))
		wantCode(t, bad, err, api.InvalidParameters, api.EParametersInvalid)
	}
	deep := strings.Repeat("[", maxParseDepth+1) + strings.Repeat("]", maxParseDepth+1)
	_, err := parseYAML(context.Background(), textParams(deep))
	wantCode(t, "too deep", err, api.InvalidParameters, api.EParameterBounds)
	// Depth reached only through aliases counts as well.
	var b strings.Builder
	b.WriteString("a0: &a0 [x]\n")
	for i := 1; i <= maxParseDepth; i++ {
		b.WriteString("a" + itoa(i) + ": &a" + itoa(i) + " [*a" + itoa(i-1) + "]\n")
	}
	_, err = parseYAML(context.Background(), textParams(b.String()))
	wantCode(t, "deep through aliases", err, api.InvalidParameters, api.EParameterBounds)
}

func itoa(i int) string { return strings.TrimSpace(string(mustJSON(i))) }

// billionLaughs is the classic alias bomb: each level is nine copies of the
// one before, so ten levels expand to 9^9 (about 387 million) leaves from a
// few hundred bytes.
const billionLaughs = `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`

func TestParseYAMLBomb(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := parseYAML(context.Background(), textParams(billionLaughs))
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	wantCode(t, "billion laughs", err, api.InvalidParameters, api.EParameterBounds)
	// Generous bounds for a loaded machine; expanding the bomb would take
	// minutes and gigabytes.
	if took > 2*time.Second {
		t.Fatalf("refusing the bomb took %v", took)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
		t.Fatalf("refusing the bomb allocated %d bytes", alloc)
	}
	// A wide, flat fan-out of one anchor is refused the same way.
	wide := "a: &a [" + strings.Repeat("x,", 1000) + "x]\nb: [" + strings.Repeat("*a,", 200) + "*a]\n"
	_, err = parseYAML(context.Background(), textParams(wide))
	wantCode(t, "wide alias fan-out", err, api.InvalidParameters, api.EParameterBounds)
	// Few nodes, but one long string repeated: bounded by bytes.
	long := "a: &a " + strings.Repeat("x", 64<<10) + "\nb: [" + strings.Repeat("*a,", 100) + "*a]\n"
	_, err = parseYAML(context.Background(), textParams(long))
	wantCode(t, "a long string aliased many times", err, api.InvalidParameters, api.EParameterBounds)
}

func FuzzParseYAML(f *testing.F) {
	for _, s := range []string{
		"a: 1\nb: [x, 2.5]\n", "- &x {k: v}\n- *x\n", "base: &b {x: 1}\nd:\n  <<: *b\n", "&a [*a]\n",
		"? [1, 2]\n: v\n", "t: 2020-01-02T03:04:05Z\n", "x: .nan\n", "!!binary aGk=", billionLaughs,
		"a: !!map {? [1]: 2}\n", "{a: 1, a: 2}", "%YAML 1.1\n---\nx\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		start := time.Now()
		out, err := parseYAML(context.Background(), textParams(text))
		if time.Since(start) > 5*time.Second {
			t.Fatalf("took %v", time.Since(start))
		}
		if err != nil {
			var te *api.Error
			if !errors.As(err, &te) || te.Code != api.InvalidParameters {
				t.Fatalf("error is not invalid_parameters: %v", err)
			}
			return
		}
		if !json.Valid(out) || len(out) > 64*maxParseBytes {
			t.Fatalf("bad result for %q: %d bytes", text, len(out))
		}
	})
}
