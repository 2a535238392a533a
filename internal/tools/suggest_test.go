package tools

import (
	"errors"
	"slices"
	"testing"

	"github.com/toolgate/toolgate/api"
)

// TestUnknownToolSuggests: E3001 names the registered tools nearest the
// unknown id (a typo, a missing namespace) and nothing far from it.
func TestUnknownToolSuggests(t *testing.T) {
	var r Registry
	for _, id := range []string{"echo", "fs.read_file", "fs.write_file", "math.eval", "sleep"} {
		r.Put(&Manifest{ID: id, Version: "1.0.0", Kind: "builtin"})
	}
	cases := map[string][]string{
		"ech":         {"echo"},
		"read_file":   {"fs.read_file"},
		"fs.readfile": {"fs.read_file"},
		"fs.write":    {"fs.write_file"},
		"zzzzzzzz":    nil,
	}
	for id, want := range cases {
		_, err := r.Resolve(id, "")
		var te *api.Error
		if !errors.As(err, &te) || te.ECode != api.EToolNotFound {
			t.Fatalf("%s: %v, want E3001", id, err)
		}
		got, _ := te.Details["did_you_mean"].([]string)
		if !slices.Equal(got, want) {
			t.Errorf("%s: did_you_mean %v, want %v (%s)", id, got, want, te.Message)
		}
	}
}
