package verify

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand"
	"os/exec"
	"path/filepath"
	"regexp/syntax"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/lucasjones/reggen"
	"github.com/zricethezav/gitleaks/v8/cmd/generate/config/utils"
	gldetect "github.com/zricethezav/gitleaks/v8/detect"
	"github.com/zricethezav/gitleaks/v8/report"

	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
)

// gitleaksModule is the yardstick: a secret scanner's rule set written apart
// from toolgate's.
const gitleaksModule = "github.com/zricethezav/gitleaks/v8"

// Floors for TestGitleaksYardstick: its recall on gitleaks' credential
// samples, and the share of gitleaks' false-positive samples the guard
// changes, those it changes on purpose included (docs/safety.md).
const (
	gitleaksRecallFloor = 0.98
	gitleaksFPCeiling   = 0.02
)

// secretPattern is the part of a gitleaks rule's pattern that is the secret
// (its secret group, else its first group, else the whole pattern), the
// part gitleaks' own generator builds its true positives from.
func secretPattern(re string, group int) (string, error) {
	tree, err := syntax.Parse(re, syntax.Perl)
	if err != nil {
		return "", err
	}
	if group == 0 && tree.MaxCap() > 0 {
		group = 1
	}
	var found *syntax.Regexp
	var walk func(*syntax.Regexp)
	walk = func(n *syntax.Regexp) {
		if found != nil {
			return
		}
		if n.Op == syntax.OpCapture && n.Cap == group {
			found = n.Sub[0]
			return
		}
		for _, s := range n.Sub {
			walk(s)
		}
	}
	walk(tree)
	if found == nil {
		return re, nil
	}
	return found.String(), nil
}

// gitleaksFalsePositives reads the false-positive samples gitleaks checks
// its own rules against: the string literals of every `fps := []string{…}`
// in its rule generator's source.
func gitleaksFalsePositives(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", gitleaksModule).Output()
	if err != nil {
		t.Skipf("gitleaks sources not found: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "cmd", "generate", "config", "rules")
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	var fps []string
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || len(as.Lhs) != 1 || len(as.Rhs) != 1 {
				return true
			}
			if id, ok := as.Lhs[0].(*ast.Ident); !ok || id.Name != "fps" {
				return true
			}
			lit, ok := as.Rhs[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			for _, e := range lit.Elts {
				if bl, ok := e.(*ast.BasicLit); ok && bl.Kind == token.STRING {
					if s, err := strconv.Unquote(bl.Value); err == nil {
						fps = append(fps, s)
					}
				}
			}
			return true
		})
	}
	return fps
}

// TestGitleaksYardstick measures the output guard with gitleaks' rule set,
// written by others: for every rule whose match is a credential, secrets
// built by gitleaks' generator from the rule's own pattern, set in its
// sample contexts (assignments in INI, JSON, YAML, code, Makefiles), go
// through the verify stage as a tool's output. A sample counts only if
// gitleaks itself finds it, and is caught when a secrets finding fired
// and the secret is not in what the caller gets. Then gitleaks' own
// false-positive samples go through, and those changed are counted. Run
// with -v for the figures per rule.
func TestGitleaksYardstick(t *testing.T) {
	gl, err := gldetect.NewDetectorDefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := setup(t, Config{})
	rules := gl.Config.GetOrderedRules()
	rng := rand.New(rand.NewSource(1))
	var total, caught int
	var missed []string
	for _, r := range rules {
		// generic-api-key is not a format but a guess from entropy.
		if r.Regex == nil || r.RuleID == "generic-api-key" {
			continue
		}
		pat, err := secretPattern(r.Regex.String(), r.SecretGroup)
		if err != nil {
			t.Fatalf("%s: %v", r.RuleID, err)
		}
		gen, err := reggen.NewGenerator(pat)
		if err != nil {
			t.Logf("%s: no generator: %v", r.RuleID, err)
			continue
		}
		gen.SetSeed(rng.Int63())
		ident := "api"
		if len(r.Keywords) > 0 {
			ident = strings.Trim(r.Keywords[0], "_-.:")
		}
		var n, c int
		for attempt := 0; attempt < 12 && n < 3; attempt++ {
			secret := gen.Generate(8)
			samples := utils.GenerateSampleSecrets(ident, secret)
			sort.Strings(samples)
			sample := samples[rng.Intn(len(samples))]
			if !slices.ContainsFunc(gl.DetectString(sample), func(f report.Finding) bool { return f.RuleID == r.RuleID }) {
				continue
			}
			n++
			if guardCatches(t, v, sample, secret) {
				c++
			} else if len(missed) < 40 {
				missed = append(missed, r.RuleID+": "+sample)
			}
		}
		if n == 0 {
			t.Logf("%-45s no sample gitleaks finds", r.RuleID)
			continue
		}
		total, caught = total+n, caught+c
		t.Logf("%-45s %s", r.RuleID, ratio(c, n))
	}
	for _, m := range missed {
		t.Logf("missed %s", m)
	}
	t.Logf("gitleaks %s: recall %s over %d rules", gitleaksModule, ratio(caught, total), len(rules))
	if total == 0 || float64(caught)/float64(total) < gitleaksRecallFloor {
		t.Errorf("recall %s below %.2f", ratio(caught, total), gitleaksRecallFloor)
	}

	// A false-positive sample counts only if gitleaks' own detector, all
	// its rules together, passes it, as a true positive counts only if it
	// finds it: some samples of one rule are true positives of another
	// (an sk-ant-admin01 key among the api03 rule's samples).
	fps := gitleaksFalsePositives(t)
	var passed, changed, kept, all int
	for _, fp := range fps {
		var by []string
		for _, f := range gl.DetectString(fp) {
			by = append(by, f.RuleID)
		}
		res, _ := json.Marshal(map[string]string{"output": fp})
		inv := invoke(string(res))
		_, err := v.Process(context.Background(), inv)
		ch := err != nil || string(inv.Result) != string(canonical(res))
		if len(by) == 0 {
			passed++
		}
		if !ch {
			continue
		}
		all++
		var rules []string
		for _, f := range inv.Findings {
			rules = append(rules, f.Rule)
		}
		switch why, ok := meantToChange[fp]; {
		case len(by) > 0:
			t.Logf("fp changed by %s, found by gitleaks' %s too: %q", strings.Join(rules, ","), strings.Join(by, ","), fp)
		case ok:
			changed++
			kept++
			t.Logf("fp changed by %s, on purpose (%s): %q", strings.Join(rules, ","), why, fp)
		default:
			changed++
			t.Logf("fp changed by %s: %q", strings.Join(rules, ","), fp)
		}
	}
	t.Logf("gitleaks false positives changed: %s of those gitleaks passes (%d on purpose: %s without them); %s of all",
		ratio(changed, passed), kept, ratio(changed-kept, passed-kept), ratio(all, len(fps)))
	if passed == 0 || float64(changed)/float64(passed) > gitleaksFPCeiling {
		t.Errorf("%s of gitleaks' false positives changed, over %.2f", ratio(changed, passed), gitleaksFPCeiling)
	}
}

// meantToChange are gitleaks' false-positive samples the guard changes on
// purpose, and why (docs/safety.md): gitleaks looks for secrets only, and
// for each provider's exact format.
var meantToChange = map[string]string{
	`author = "james.fake@ymail.com",`: "an e-mail address is personal data",
	`curl --insecure --ssl-reqd "smtps://smtp.gmail.com" --mail-from "src@gmail.com" --mail-rcpt "dst@gmail.com" --user "src@gmail.com" --upload-file out.txt`: "e-mail addresses are personal data",
	`<iframe src="./archive/gifs/api-c99e353f761d318322c853c03e.gif"> </iframe>`:                                                                               "markup is escaped",
	`,apiKey:"6fe4476ee5a1832882e326b506d14126",`:                                                                                                              "32 hex digits assigned to apiKey are a key",
	`MailchimpSDK.initialize(token: 3012a5754bbd716926f99c028f7ea428-us18)`:                                                                                    "a Mailchimp key; gitleaks' source calls this sample its false negative",
}

// guardCatches says whether the verify stage, given sample as a tool's
// output, fired a secrets finding and kept secret from the caller.
func guardCatches(t *testing.T, v *Verifier, sample, secret string) bool {
	res, _ := json.Marshal(map[string]string{"output": sample})
	inv := invoke(string(res))
	_, err := v.Process(context.Background(), inv)
	if !slices.ContainsFunc(inv.Findings, func(f envelope.Finding) bool { return f.Detector == string(detect.Secrets) }) {
		return false
	}
	return err != nil || !strings.Contains(string(inv.Result), secret)
}
