package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfine(t *testing.T) {
	base := t.TempDir()
	root := filepath.Join(base, "data")
	if err := os.MkdirAll(filepath.Join(root, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A symlink inside the root that points outside it.
	if err := os.Symlink(base, filepath.Join(root, "out")); err != nil {
		t.Fatal(err)
	}
	grants := []tools.FilesystemPermission{{Path: root, Mode: "ro"}}
	allowed := []string{"reports/q3.csv", "./a.txt", root + "/in/x.txt", root, "file..txt"}
	denied := []string{
		"../x", "a/../../x", `..\x`, "%2e%2e/x", "%252e%252e%252fx", "a%00.png",
		"/etc/shadow", root + "_evil/x", root + "/out/secret", root + "/in/../../x",
	}
	for _, p := range allowed {
		if err := confine(p, grants); err != nil {
			t.Errorf("%q refused: %v", p, err)
		}
	}
	for _, p := range denied {
		err := confine(p, grants)
		if err == nil || !errors.Is(err, api.ErrPermissionDenied) || err.ECode != api.EPathOutsideRoots {
			t.Errorf("%q allowed (%v)", p, err)
		}
	}
	if err := confine("/srv/x", nil); err == nil {
		t.Error("an absolute path passed with no granted root")
	}
}

func TestCheckBounds(t *testing.T) {
	ok := `{"a":[{"b":"` + strings.Repeat("x", 100) + `"}]}`
	if err := checkBounds([]byte(ok), 4, 200); err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string]string{
		"deep":     `{"a":{"b":{"c":{"d":{"e":1}}}}}`,
		"long":     `{"a":"` + strings.Repeat("x", 201) + `"}`,
		"long key": `{"` + strings.Repeat("k", 201) + `":1}`,
	} {
		err := checkBounds([]byte(doc), 4, 200)
		var te *api.Error
		if !errors.As(err, &te) || te.ECode != api.EParameterBounds {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzCheckBounds: the pass over the bytes accepts only what the decoded
// tokens accept, and checkBounds answers as they do.
func FuzzCheckBounds(f *testing.F) {
	f.Add(`{"a":[{"b":"xx\"\\u00e9y"}]}`, 2, 4)
	f.Add(`{"a":{"b":{"c":1}}}`, 2, 10)
	f.Add("{\"\xff\xfe\":\"\\ud83d\\ude00\"}", 3, 2)
	f.Add(`["\u2028","\n\t"]`, 1, 1)
	f.Fuzz(func(t *testing.T, doc string, depth, long int) {
		if !json.Valid([]byte(doc)) || depth < 0 || long < 0 {
			t.Skip()
		}
		want := tokenBounds([]byte(doc), depth, long)
		if withinBounds([]byte(doc), depth, long) && want != nil {
			t.Fatalf("the byte pass accepts what the tokens refuse: %v", want)
		}
		if got := checkBounds([]byte(doc), depth, long); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("checkBounds %v, the tokens %v", got, want)
		}
	})
}
