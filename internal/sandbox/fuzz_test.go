package sandbox

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzControlLines: a tool's stdout, written in arbitrary chunks, comes out
// as the control lines (handed over whole) and everything else (passed on
// byte for byte), however the writes split it.
func FuzzControlLines(f *testing.F) {
	f.Add([]byte("toolgate:progress 50 half\n{\"ok\":true}\ntoolgate:checkpoint {\"n\":1}\n"), uint8(3))
	f.Add([]byte("no newline toolgate:progress 1"), uint8(1))
	f.Add([]byte("toolgate:checkpoint"), uint8(7))
	f.Add([]byte("\n\ntoolgate:\ntoolgate:x y z\r\n"), uint8(2))
	f.Fuzz(func(t *testing.T, out []byte, chunk uint8) {
		var verbs [][]byte
		sink := &capped{limit: int64(len(out)) + 1}
		lf := &lineFilter{out: sink, control: func(verb string, arg []byte) {
			verbs = append(verbs, append([]byte(verb+" "), arg...))
		}}
		step := int(chunk%16) + 1
		for i := 0; i < len(out); i += step {
			_, _ = lf.Write(out[i:min(i+step, len(out))])
		}
		lf.flush()
		// The reference: split into lines, keep those without the prefix.
		var want bytes.Buffer
		controls := 0
		for _, line := range bytes.SplitAfter(out, []byte("\n")) {
			if bytes.HasPrefix(line, []byte(ControlPrefix)) {
				controls++
				continue
			}
			want.Write(line)
		}
		if !bytes.Equal(sink.buf.Bytes(), want.Bytes()) {
			t.Fatalf("passed on %q, want %q", sink.buf.Bytes(), want.Bytes())
		}
		if len(verbs) != controls {
			t.Fatalf("%d control lines handed over, want %d", len(verbs), controls)
		}
	})
}

// FuzzExpand: a parameter reaches the command as exactly one argument,
// unchanged, whatever it holds.
func FuzzExpand(f *testing.F) {
	for _, s := range []string{"; rm -rf /", "$(id)", "`id`", "a b\nc", "{{x}}", "", "--help"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		params, _ := json.Marshal(map[string]string{"x": v})
		argv, err := Expand([]string{"tool", "--flag", "{{x}}", "{{x}}-literal"}, params)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		_ = json.Unmarshal(mustMarshal(v), &want)
		if len(argv) != 4 || argv[0] != "tool" || argv[1] != "--flag" || argv[2] != want || argv[3] != "{{x}}-literal" {
			t.Fatalf("argv %q for %q", argv, v)
		}
	})
}

func mustMarshal(v string) []byte {
	b, _ := json.Marshal(v)
	return b
}
