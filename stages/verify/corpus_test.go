package verify

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
)

// outputCase is one labelled tool output of testdata/outputs/<category>.jsonl.
type outputCase struct {
	// Want is the detector that must fire ("" for a benign output, which
	// must reach the caller unchanged).
	Want string `json:"want"`
	Note string `json:"note"`
	// Leak lists text that must not reach the caller, nor appear in any
	// finding or error.
	Leak   []string        `json:"leak"`
	Result json.RawMessage `json:"result"`
	line   int
}

func readOutputs(t testing.TB) map[string][]outputCase { return readCorpus(t, "outputs") }

// readCorpus reads testdata/<dir>/<category>.jsonl.
func readCorpus(t testing.TB, dir string) map[string][]outputCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.jsonl"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	out := map[string][]outputCase{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		cat := strings.TrimSuffix(filepath.Base(name), ".jsonl")
		for n := 1; sc.Scan(); n++ {
			var c outputCase
			if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
				t.Fatalf("%s:%d: %v", name, n, err)
			}
			c.line = n
			out[cat] = append(out[cat], c)
		}
		f.Close()
	}
	return out
}

// outcome runs one output through the verify stage with the default policy
// and says whether it was handled as labelled: a hostile output is caught
// when its detector fired and none of its leaks reached the caller; a
// benign one is intact when it passed unchanged. It fails t if a finding
// or an error repeats a leak.
func outcome(t testing.TB, v *Verifier, c outputCase) (ok bool, why string) {
	inv := invoke(string(c.Result))
	_, err := v.Process(context.Background(), inv)
	var said strings.Builder
	for _, f := range inv.Findings {
		said.WriteString(f.Rule + " " + f.Path + "\n")
	}
	if err != nil {
		said.WriteString(err.Error())
		b, _ := json.Marshal(api.AsError(err).Details)
		said.Write(b)
	}
	for _, l := range c.Leak {
		if strings.Contains(said.String(), l) {
			t.Errorf("line %d: a finding or error repeats %q: %s", c.line, l, said.String())
		}
	}
	if c.Want == "" {
		if err != nil {
			return false, "rejected: " + err.Error()
		}
		if string(inv.Result) != string(canonical(c.Result)) {
			return false, "changed to " + string(inv.Result)
		}
		return true, ""
	}
	fired := slices.ContainsFunc(inv.Findings, func(f envelope.Finding) bool { return f.Detector == c.Want })
	if !fired {
		return false, "no " + c.Want + " finding; findings " + strings.ReplaceAll(said.String(), "\n", ", ")
	}
	if err == nil {
		for _, l := range c.Leak {
			if strings.Contains(string(inv.Result), l) {
				return false, "leaked " + l + " in " + string(inv.Result)
			}
		}
	}
	return true, ""
}

// recallFloors are the least recall on each category's hostile outputs;
// every category must also pass benignFloor of its benign ones intact. They
// sit at or just under what the stage reaches, as a regression floor: the
// corpus was written alongside the rules (see docs/safety.md).
var recallFloors = map[string]float64{
	"secrets_plain": 0.95, "secrets_provider": 0.95, "secrets_transformed": 0.90, "secrets_split": 0.90,
	"secrets_keys": 0.95, "pii_plain": 0.95, "pii_more": 0.95, "injection": 0.90,
}

const benignFloor = 0.95

// TestOutputCorpus runs every labelled output through the verify stage and
// reports, per category, the recall on hostile outputs and the share of
// benign ones passed intact. Run with -v to see the table.
func TestOutputCorpus(t *testing.T) {
	checkCorpus(t, readOutputs(t), recallFloors, benignFloor, false)
}

// heldOutFloor is the least recall in every hostile category, and the least
// share intact in every benign one, of testdata/heldout: outputs written
// from each category's description alone, apart from the rules, and
// measured before the rules were changed for them (docs/safety.md).
const heldOutFloor = 0.95

// TestHeldOutCorpus runs the held-out outputs as TestOutputCorpus runs its
// own. Run with -v to see the table.
func TestHeldOutCorpus(t *testing.T) {
	cats := readCorpus(t, "heldout")
	floors := map[string]float64{}
	for k := range cats {
		floors[k] = heldOutFloor
	}
	checkCorpus(t, cats, floors, heldOutFloor, true)
}

// checkCorpus runs cats through the verify stage with the default policy
// and holds each category to its floors. With unflagged, a benign output
// is intact only if malicious_code did not fire on it either: its flag
// changes nothing the caller sees but still calls a benign output hostile.
// (The input detectors' flags on outputs, sql and shell syntax in any
// code, are not counted.)
func checkCorpus(t *testing.T, cats map[string][]outputCase, floors map[string]float64, benignFloor float64, unflagged bool) {
	v, _ := setup(t, Config{})
	names := make([]string, 0, len(cats))
	for k := range cats {
		names = append(names, k)
	}
	sort.Strings(names)
	var hostile, caught, benign, intact int
	for _, cat := range names {
		var h, hc, b, bi int
		for _, c := range cats[cat] {
			ok, why := outcome(t, v, c)
			if unflagged && ok && c.Want == "" {
				inv := invoke(string(c.Result))
				_, _ = v.Process(context.Background(), inv)
				for _, f := range inv.Findings {
					if f.Detector == string(detect.MaliciousCode) {
						ok, why = false, "flagged "+f.Rule
					}
				}
			}
			if c.Want != "" {
				h++
				if ok {
					hc++
				}
			} else {
				b++
				if ok {
					bi++
				}
			}
			if !ok {
				t.Logf("%s:%d %s: %s", cat, c.line, c.Note, why)
			}
		}
		hostile, caught, benign, intact = hostile+h, caught+hc, benign+b, intact+bi
		t.Logf("%-22s recall %s  benign intact %s", cat, ratio(hc, h), ratio(bi, b))
		if fl, ok := floors[cat]; h > 0 && (!ok || float64(hc)/float64(h) < fl) {
			t.Errorf("%s: recall %s below its floor %.2f", cat, ratio(hc, h), fl)
		}
		if b > 0 && float64(bi)/float64(b) < benignFloor {
			t.Errorf("%s: benign intact %s below %.2f", cat, ratio(bi, b), benignFloor)
		}
	}
	t.Logf("%-22s recall %s  benign intact %s", "overall", ratio(caught, hostile), ratio(intact, benign))
}

func ratio(n, d int) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f (%d/%d)", float64(n)/float64(d), n, d)
}

// BenchmarkOutputCorpus reports, for each category of the labelled outputs
// and overall, the figures TestOutputCorpus holds to its floors (recall on
// the hostile outputs, the share of benign ones passed intact) and the
// stage's speed on them, µs per KiB of output, all detectors on: the
// per-category rows of `make bench`.
func BenchmarkOutputCorpus(b *testing.B) {
	v, _ := setup(b, Config{})
	cats := readOutputs(b)
	names := make([]string, 0, len(cats)+1)
	var all []outputCase
	for k := range cats {
		names = append(names, k)
		all = append(all, cats[k]...)
	}
	sort.Strings(names)
	cats["overall"] = all
	for _, cat := range append(names, "overall") {
		cases := cats[cat]
		b.Run(cat, func(b *testing.B) {
			var h, hc, bn, bi, size int
			for _, c := range cases {
				ok, _ := outcome(b, v, c)
				size += len(c.Result)
				switch {
				case c.Want != "":
					h++
					if ok {
						hc++
					}
				default:
					bn++
					if ok {
						bi++
					}
				}
			}
			b.ResetTimer()
			for b.Loop() {
				for _, c := range cases {
					_, _ = v.Process(context.Background(), invoke(string(c.Result)))
				}
			}
			b.StopTimer()
			if h > 0 {
				b.ReportMetric(float64(hc)/float64(h), "recall")
			}
			if bn > 0 {
				b.ReportMetric(float64(bi)/float64(bn), "benign-intact")
			}
			// Outputs are small (a few hundred bytes): per KiB, the per-call
			// cost weighs in; per output shows it apart.
			us := float64(b.Elapsed().Microseconds()) / float64(b.N)
			b.ReportMetric(us/(float64(size)/1024), "µs/KiB")
			b.ReportMetric(us/float64(len(cases)), "µs/output")
			b.ReportMetric(float64(len(cases)), "cases")
		})
	}
}
