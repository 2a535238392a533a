package detect

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// floors are the least precision and recall each detector must reach on its
// labelled corpus (testdata/corpus/<detector>.txt).
var floors = map[Detector]struct{ precision, recall float64 }{
	Secrets:          {0.95, 0.95},
	PII:              {0.95, 0.95},
	PromptInjection:  {0.95, 0.95},
	SQLInjection:     {0.95, 0.90},
	CommandInjection: {0.95, 0.95},
	PathTraversal:    {0.95, 0.95},
}

type sample struct {
	hostile bool
	text    string
	line    int
}

func readCorpus(t testing.TB, d Detector) []sample {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "corpus", string(d)+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []sample
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		label, text, ok := strings.Cut(line, "\t")
		if !ok || (label != "+" && label != "-") {
			t.Fatalf("%s.txt:%d: want '+' or '-', a tab, then the sample", d, n)
		}
		out = append(out, sample{hostile: label == "+", text: strings.ReplaceAll(text, `\n`, "\n"), line: n})
	}
	return out
}

// TestCorpusQuality measures every detector on its labelled corpus and fails
// below the floors. Run with -v to see the table.
func TestCorpusQuality(t *testing.T) {
	e := Default()
	for _, d := range []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal} {
		samples := readCorpus(t, d)
		var tp, fp, fn, tn int
		for _, s := range samples {
			hit := e.Detected(s.text, d)
			switch {
			case hit && s.hostile:
				tp++
			case hit && !s.hostile:
				fp++
				t.Logf("%s false positive (line %d): %q %v", d, s.line, s.text, e.Scan(s.text, d))
			case !hit && s.hostile:
				fn++
				t.Logf("%s missed (line %d): %q", d, s.line, s.text)
			default:
				tn++
			}
		}
		precision := float64(tp) / float64(max(tp+fp, 1))
		recall := float64(tp) / float64(max(tp+fn, 1))
		t.Logf("%-18s samples %4d  precision %.3f  recall %.3f  (tp %d fp %d fn %d tn %d)", d, len(samples), precision, recall, tp, fp, fn, tn)
		if tp+fn < 30 || fp+tn < 30 {
			t.Errorf("%s: corpus too small (%d hostile, %d benign)", d, tp+fn, fp+tn)
		}
		fl := floors[d]
		if precision < fl.precision || recall < fl.recall {
			t.Errorf("%s: precision %.3f / recall %.3f below the floor %.2f / %.2f", d, precision, recall, fl.precision, fl.recall)
		}
	}
}

func TestRuleFindingsNameTheRule(t *testing.T) {
	fs := Default().Scan("key AKIAQ4NB7XWZ3RTK2M5H in a log line", Secrets)
	if len(fs) != 1 || fs[0].Rule != "secret.aws_access_key_id" || fs[0].Offset != 4 || fs[0].Length != 20 {
		t.Fatalf("findings %+v", fs)
	}
	if Default().Version() == "" {
		t.Fatal("the shipped rule set has no version")
	}
}

func TestValidators(t *testing.T) {
	e := Default()
	if !e.Detected("card 4539 1478 7789 3280 on file", PII) || e.Detected("card 4539 1478 7789 3281", PII) {
		t.Fatal("card numbers must pass the Luhn check")
	}
	if !e.Detected("IBAN GB82 WEST 1234 5698 7654 32", PII) || e.Detected("ref GB82WEST12345698765433", PII) {
		t.Fatal("IBANs must pass mod-97")
	}
	if !e.Detected("ssn 123-45-6789", PII) || e.Detected("ssn 666-45-6789", PII) {
		t.Fatal("SSN area numbers must be plausible")
	}
}

func TestRedactAndEscapeJSON(t *testing.T) {
	doc := []byte(`{"note":"mail bob@example.com","nested":[{"k":"AKIAQ4NB7XWZ3RTK2M5H and AKIA6DJQ2PWL8ZK4VHT3"}],"n":12345678901234567890}`)
	out, fs, err := Default().RedactJSON(doc, Secrets, PII)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "bob@example.com") || strings.Contains(s, "AKIA") || !strings.Contains(s, "[REDACTED:pii.email]") ||
		!strings.Contains(s, "12345678901234567890") || len(fs) != 3 {
		t.Fatalf("redacted %s, findings %+v", s, fs)
	}
	if fs[0].Path == "" {
		t.Fatalf("findings carry no JSON pointer: %+v", fs)
	}
	clean := []byte(`{"a":"nothing to see"}`)
	if out, fs, _ := Default().RedactJSON(clean, All...); string(out) != string(clean) || fs != nil {
		t.Fatal("a clean document must come back untouched")
	}
	esc, _, err := Default().EscapeJSON([]byte(`{"html":"<script>alert(1)</script>"}`), XSS)
	if err != nil || strings.Contains(string(esc), "<script>") {
		t.Fatalf("escaped %s, %v", esc, err)
	}
}

func TestLoadRejectsBadRuleSets(t *testing.T) {
	for name, doc := range map[string]string{
		"not JSON":          `{`,
		"no version":        `{"rules":[{"id":"a.b","detector":"pii","pattern":"x"}]}`,
		"bad regexp":        `{"version":"1","rules":[{"id":"a.b","detector":"pii","pattern":"(?<=x)"}]}`,
		"unknown detector":  `{"version":"1","rules":[{"id":"a.b","detector":"magic","pattern":"x"}]}`,
		"duplicate id":      `{"version":"1","rules":[{"id":"a.b","detector":"pii","pattern":"x"},{"id":"a.b","detector":"pii","pattern":"y"}]}`,
		"unknown validator": `{"version":"1","rules":[{"id":"a.b","detector":"pii","pattern":"x","validator":"crc"}]}`,
	} {
		if _, err := Load([]byte(doc)); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// pathological inputs for regular expressions that backtrack; RE2 does not.
func pathological(n int) map[string]string {
	return map[string]string{
		"repeated a":       strings.Repeat("a", n),
		"quotes":           strings.Repeat("' OR ", n/5),
		"dots and slashes": strings.Repeat("../", n/3),
		"digits":           strings.Repeat("4111 ", n/5),
		"base64":           strings.Repeat("eyJhbGciOi", n/10),
		"at signs":         strings.Repeat("a@", n/2),
	}
}

// BenchmarkScan reports the detectors' cost per KiB on 1 MiB inputs,
// pathological ones included.
func BenchmarkScan(b *testing.B) {
	e := Default()
	for name, s := range pathological(1 << 20) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				e.Scan(s)
			}
		})
	}
}

func FuzzScan(f *testing.F) {
	for _, d := range []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal} {
		for _, s := range readCorpus(f, d)[:5] {
			f.Add(s.text)
		}
	}
	// The inputs built against the scanner, 4 KiB of each, one repeated
	// character and invalid UTF-8 among them.
	for _, in := range BenchInputs(4 << 10) {
		f.Add(in.Text)
	}
	e := Default()
	f.Fuzz(func(t *testing.T, s string) {
		for _, fd := range e.Scan(s) {
			if fd.Offset < 0 || fd.Offset+fd.Length > len(s) || fd.Rule == "" {
				t.Fatalf("finding out of bounds: %+v for %d bytes", fd, len(s))
			}
		}
		doc, _ := json.Marshal(map[string]string{"v": s})
		out, _, err := e.RedactJSON(doc, Secrets)
		if err != nil || !json.Valid(out) {
			t.Fatalf("redaction broke the document: %s, %v", out, err)
		}
		if fs, _ := e.ScanJSON(out, Secrets); len(fs) > 0 {
			t.Fatalf("a secret survived redaction: %+v in %s", fs, out)
		}
	})
}

// TestScansMiBInputs runs every detector over 1 MiB inputs built to make
// backtracking engines explode; with RE2 each completes in linear time
// (the figures are in `make bench`), and findings stay within the input.
func TestScansMiBInputs(t *testing.T) {
	e := Default()
	for name, s := range pathological(1 << 20) {
		for _, f := range e.Scan(s) {
			if f.Offset < 0 || f.Offset+f.Length > len(s) {
				t.Fatalf("%s: finding out of bounds %+v", name, f)
			}
		}
	}
}

func TestPrivateKeyBlocksRedactedWhole(t *testing.T) {
	pem := "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1234567890abcdef\nQWERTYUIOPASDFGH\n-----END RSA PRIVATE KEY-----\nafter"
	unterminated := "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nmore material"
	jwkText := `here {"kty":"RSA","n":"0vx7agoebGcQSuuPiLJXZpt","e":"AQAB","d":"X4cTteJY_gn4FYPsXB8rdXix5vwsg1FLN5E3EaG6RJoVH-HLLKD9"} end`
	doc, _ := json.Marshal(map[string]any{"pem": pem, "open": unterminated, "text": jwkText,
		"jwk": map[string]any{"kty": "EC", "crv": "P-256", "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "d": "jpsQnnGQmL-YBIffH1136cspYG6-0iY7X1fCE9-E9LI"}})
	out, _, err := Default().RedactJSON(doc, Secrets)
	if err != nil {
		t.Fatal(err)
	}
	for _, leak := range []string{"MIIEpAIBAAKCAQEA", "QWERTYUIOPASDFGH", "MIIEvQIBADAN", "more material", "X4cTteJY", "jpsQnnGQmL"} {
		if strings.Contains(string(out), leak) {
			t.Errorf("%s survived: %s", leak, out)
		}
	}
	if !strings.Contains(string(out), `after`) || !strings.Contains(string(out), `f83OJ3D2`) {
		t.Errorf("redacted more than the key: %s", out)
	}
}

func TestKeysAndNumbersScanned(t *testing.T) {
	doc := []byte(`{"AKIAQ4NB7XWZ3RTK2M5H":1,"card":4539147877893280,"password":"hunter22","n":42}`)
	out, fs, err := Default().RedactJSON(doc, Secrets, PII)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "AKIAQ4NB7XWZ3RTK2M5H") || strings.Contains(s, "4539147877893280") || strings.Contains(s, "hunter22") || !strings.Contains(s, `"n":42`) {
		t.Fatalf("redacted %s, findings %+v", s, fs)
	}
}

// TestPrefilterAgreesWithFullScan checks that scanning only near keywords
// (and at them, for anchored rules) finds what running every rule over the
// whole text finds, on the corpus, alone and padded with prose. The race
// detector, which has nothing to find in this one goroutine, makes it take
// fifteen times as long: under it every eighth sample is checked, and
// make test runs it whole without it.
func TestPrefilterAgreesWithFullScan(t *testing.T) {
	e := Default()
	pad := strings.Repeat("The quarterly report covers sales; see the guide. ", 12)
	every := 1
	if raceEnabled {
		every = 8
	}
	for _, d := range []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal} {
		for i, smp := range readCorpus(t, d) {
			if i%every != 0 {
				continue
			}
			for _, s := range []string{smp.text, pad + smp.text + pad, pad + "x" + smp.text} {
				got := map[string]bool{}
				for _, f := range e.scanRaw(s, nil) {
					got[f.Rule] = true
				}
				for _, c := range e.all {
					if c.Keyed {
						continue // context words, not in every match: nothing to agree on
					}
					full := false
					for _, loc := range c.re.FindAllStringIndex(s, -1) {
						if c.valid == nil || c.valid(s[loc[0]:loc[1]]) {
							full = true
							break
						}
					}
					if full != got[c.ID] {
						t.Errorf("%s line %d: rule %s full scan %v, prefiltered %v on %q", d, smp.line, c.ID, full, got[c.ID], s)
					}
				}
			}
		}
	}
}

// TestWindowsAgreeOnLongText compares the windowed scan with full scans of
// every rule, match by match, on a text longer than a window, made of the
// whole corpus.
func TestWindowsAgreeOnLongText(t *testing.T) {
	e := Default()
	var b strings.Builder
	for _, d := range []Detector{Secrets, PII, PromptInjection, SQLInjection, CommandInjection, PathTraversal} {
		for i, smp := range readCorpus(t, d) {
			b.WriteString(smp.text)
			if b.WriteString(" and then "); i%5 == 0 {
				b.WriteString("4539 1478 7789 3280 ")
			}
		}
	}
	s := b.String()
	got := map[[2]int]string{}
	for _, f := range e.scanRaw(s, nil) {
		if !e.ids[f.Rule].Keyed {
			got[[2]int{f.Offset, f.Length}] += f.Rule + " "
		}
	}
	want := map[[2]int]string{}
	for _, c := range e.all {
		if c.Keyed {
			continue
		}
		for _, loc := range c.re.FindAllStringIndex(s, -1) {
			if c.valid == nil || c.valid(s[loc[0]:loc[1]]) {
				want[[2]int{loc[0], loc[1] - loc[0]}] += c.ID + " "
			}
		}
	}
	for k, v := range want {
		if got[k] == "" {
			t.Errorf("missed %s at %v: %q", v, k, s[k[0]:k[0]+k[1]])
		}
	}
	for k, v := range got {
		if want[k] == "" {
			t.Errorf("extra %s at %v: %q", v, k, s[k[0]:k[0]+k[1]])
		}
	}
}

func TestMaxSpan(t *testing.T) {
	for pat, want := range map[string]int{`abc`: 4, `a{2,5}`: 6, `a+`: 0, `(?:ab|c)[0-9]{3}`: 2 + 12 + 1, `\bx\b`: 2} {
		if got := maxSpan(pat); got != want {
			t.Errorf("maxSpan(%s) = %d, want %d", pat, got, want)
		}
	}
	for _, c := range Default().all {
		if c.at != nil {
			t.Logf("%s spans %d", c.ID, c.span)
		}
	}
}

func TestFirstBytes(t *testing.T) {
	for pat, want := range map[string]string{
		`\b[A-Z]{2}[0-9]{2}`: "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
		`(?i)key`:            "Kk\x80",
		`(?:ab|c)?d+`:        "acd",
		`\s*x`:               "\t\n\f\r x",
		`a*`:                 "",
		`(?:x|)`:             "",
	} {
		set := firstBytes(pat)
		if want == "" {
			if set != nil {
				t.Errorf("firstBytes(%s): a set, for a pattern that matches empty", pat)
			}
			continue
		}
		for b := range 256 {
			// "\x80" in want stands for every byte from 0x80.
			in := strings.IndexByte(want, byte(b)) >= 0 || b >= 0x80 && strings.Contains(want, "\x80")
			if set == nil || set[b] != in {
				t.Errorf("firstBytes(%s)[%q] = %v, want %v", pat, byte(b), set != nil && set[b], in)
			}
		}
	}
}

// TestResumeAfterMatchLimit: more raw matches than the limit, most failing
// their validator, must not hide a valid one further on.
func TestResumeAfterMatchLimit(t *testing.T) {
	s := strings.Repeat("1234 5678 9012 3456 789, ", 600) + "card 4539 1478 7789 3280 end"
	fs := Default().Scan(s, PII)
	var found bool
	for _, f := range fs {
		if f.Rule == "pii.payment_card" && s[f.Offset:f.Offset+f.Length] == "4539 1478 7789 3280" {
			found = true
		}
	}
	if !found {
		t.Fatalf("the card after %d invalid candidates was missed: %+v", 600, fs)
	}
}

func TestOptionInjection(t *testing.T) {
	for s, want := range map[string]bool{
		"--upload-pack=sleep 4;": true, "-oProxyCommand=id": true, " --exec=x": true, "-x": true,
		"repo": false, "-": false, "-5": false, "-2.5e3": false, "a-b": false, "": false, "x --y": false,
	} {
		if got := OptionInjection(s); got != want {
			t.Errorf("OptionInjection(%q) = %v, want %v", s, got, want)
		}
	}
}

// FuzzDecodeForms feeds the decoders of outside text (escapes, lists of
// byte values, encoded runs) and the shape forms: nothing panics, decoded
// text stays within its bounds, and every span of a shape form maps back
// inside the original.
func FuzzDecodeForms(f *testing.F) {
	for _, s := range []string{`\x41\x4b\x49\x41`, `[104, 105, 0x41, 66, 67, 68, 69, 70]`, `fromCharCode(115,107,95,108,105,118,101,95)`,
		`\u0067\u0068\u0070\u005f`, "A K I A 2 E 0 A", "g-h-p-_-N-a-y", "line\\\nnext\r\n  more", "Z2hwXzEyMzQ1Njc4OTBhYmNkZWY=",
		// Literals one after another, labelled lines, dash groups, escapes
		// among plain text.
		"KEY=\"ghp_8rESQedUStPK\" \\\n\"R0CsTy4Qwb8Dwk\"", `t = ("ghp_8rES" + 'x' "QedU")`, "token part 1/2: ghp_8rES\ntoken part 2/2: QedUSt\n:\n",
		"ghp_-8rES-QedU-StPK-", `\u0073\u006b-plain\x5f`, `"`, `" "`, "a:\n:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d := decodeEscapes(s); len(d) > maxDecoded+len(s) {
			t.Fatalf("decoded %d bytes from %d", len(d), len(s))
		}
		if u := unescape(s); len(u) > len(s) {
			t.Fatalf("unescaped %d bytes into %d", len(s), len(u))
		}
		if n, ok := normalise(s); ok {
			for _, v := range n {
				if len(v) > 4*maxDecoded+4*len(s) {
					t.Fatalf("a normalised form of %d bytes has %d", len(s), len(v))
				}
			}
		}
		for _, fm := range shapeForms(s, hintReversed|hintROT13|hintPlain) {
			for a := 0; a < len(fm.s); a++ {
				for _, b := range []int{a + 1, len(fm.s)} {
					x, y := fm.span(a, b)
					if x < 0 || y > len(s) || x >= y {
						t.Fatalf("form span [%d,%d) maps to [%d,%d) of %d bytes", a, b, x, y, len(s))
					}
				}
			}
		}
	})
}

// FuzzScanJSON holds the structural scan of a JSON document to its
// promises: redaction keeps it JSON, what it redacts is not found again,
// and no finding's path repeats a secret a member name holds.
func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, `{"ghp_8rESQedUStPKR0CsTy4Qwb8DwkNhFdnXsiVp":{"x":1}}`, `{"key_part_1":"ghp_8rESQedUStPKR0Cs","key_part_2":"Ty4Qwb8DwkNhFdnXsiVp"}`,
		`[103,104,112,95,56,114,69,83,81,101,100,85,83,116]`, `{"tokens":{"a1b2c3d4e5f6a7b8c9d0":"x"}}`, `{"lines":["-----BEGIN PRIVATE KEY-----","MIIE","-----END PRIVATE KEY-----"]}`,
		`{"a":"-----BEGIN RSA PRIVATE KEY-----","b":"MIIEow","c":"-----END RSA PRIVATE KEY-----"}`,
		`{"lines":["t = (","  \"ghp_8rESQedUStPKR0Cs\"","  \"Ty4Qwb8DwkNhFdnXsiVp\"",")"]}`,
		// Deep nesting, ten thousand tiny members, invalid UTF-8 in a
		// string and in a name.
		strings.Repeat(`{"a":[`, 500) + `"x"` + strings.Repeat("]}", 500), tinyFields(10000),
		"{\"s\":\"\xff\xfe\xc3 token = \xff\"}", "{\"\xc3\x28\":\"ghp_8rESQedUStPKR0CsTy4Qwb8DwkNhFdnXsiVp\"}"} {
		f.Add(s)
	}
	e := Default()
	f.Fuzz(func(t *testing.T, doc string) {
		if !json.Valid([]byte(doc)) {
			return
		}
		fs, err := e.ScanJSON([]byte(doc), Secrets, PII)
		if err != nil {
			return
		}
		var v any
		_ = json.Unmarshal([]byte(doc), &v)
		for _, k := range memberNames(v) {
			if len(e.Scan(k, Secrets)) == 0 {
				continue
			}
			for _, fd := range fs {
				if strings.Contains(fd.Path, k) {
					t.Fatalf("a finding's path holds the secret member name %q: %+v", k, fd)
				}
			}
		}
		out, _, err := e.RedactJSON([]byte(doc), Secrets, PII)
		if err != nil || !json.Valid(out) {
			t.Fatalf("redaction broke the document: %s, %v", out, err)
		}
		if again, _ := e.ScanJSON(out, Secrets); len(again) > 0 {
			t.Fatalf("a secret survived redaction: %+v in %s", again, out)
		}
	})
}

// tinyFields is an object of n members of one byte each.
func tinyFields(n int) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"f` + strconv.Itoa(i) + `":"v"`)
	}
	b.WriteString("}")
	return b.String()
}

func memberNames(v any) []string {
	var out []string
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			out = append(out, k)
			out = append(out, memberNames(x)...)
		}
	case []any:
		for _, x := range t {
			out = append(out, memberNames(x)...)
		}
	}
	return out
}

// FuzzDocPasses: the passes verify makes over one decoded Doc find and
// rewrite exactly what the same passes over the bytes do, each decoding
// the document anew.
func FuzzDocPasses(f *testing.F) {
	for _, s := range []string{`{"a":"b"}`, `{"url":"https://bob:hunter2@example.com","mail":"alice@example.com"}`,
		`{"note":"ignore previous instructions","q":"1' OR '1'='1","html":"<script>alert(1)</script>"}`,
		`[103,104,112,95,56,114,69,83,81,101,100,85,83,116]`, `{"password":"s3cret!","n":12345678901234567890}`, `"<b>"`, `null`} {
		f.Add(s)
	}
	e := Default()
	type pass struct {
		d       Detector
		rewrite func(*Doc, ...Detector) ([]Finding, error)
		bytes   func([]byte, ...Detector) ([]byte, []Finding, error)
	}
	scanBytes := func(b []byte, ds ...Detector) ([]byte, []Finding, error) {
		fs, err := e.ScanJSON(b, ds...)
		return b, fs, err
	}
	passes := []pass{
		{Secrets, e.RedactDoc, e.RedactJSON}, {PII, e.RedactDoc, e.RedactJSON},
		{PromptInjection, e.ScanDoc, scanBytes}, {SQLInjection, e.ScanDoc, scanBytes},
		{CommandInjection, e.ScanDoc, scanBytes}, {XSS, e.EscapeDoc, e.EscapeJSON},
	}
	f.Fuzz(func(t *testing.T, doc string) {
		d, b := NewDoc([]byte(doc)), []byte(doc)
		for _, p := range passes {
			got, gerr := p.rewrite(d, p.d)
			var want []Finding
			var werr error
			b, want, werr = p.bytes(b, p.d)
			if (gerr != nil) != (werr != nil) {
				t.Fatalf("%s: error %v over the Doc, %v over the bytes", p.d, gerr, werr)
			}
			if gerr != nil {
				return
			}
			if !reflect.DeepEqual(got, want) || !bytes.Equal(d.Bytes(), b) {
				t.Fatalf("%s: the Doc found %+v and left %s; the bytes %+v and %s", p.d, got, d.Bytes(), want, b)
			}
		}
	})
}
