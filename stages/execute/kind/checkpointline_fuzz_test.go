package kind

import (
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/api"
)

// FuzzCheckpointLine: whatever a tool writes after a checkpoint verb is
// either refused or read as a kind, a printable name within the bound and
// JSON state; a named checkpoint always has a name.
func FuzzCheckpointLine(f *testing.F) {
	for _, s := range []string{`{"next":5}`, `parsed {"next":5}`, `[1,2]`, `a b`, "x\x00 {}", ``, `n {`} {
		for _, v := range []string{"checkpoint", "checkpoint.macro", "checkpoint.named"} {
			f.Add(v, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, verb string, arg []byte) {
		kind, name, state, err := ParseCheckpoint(verb, arg)
		if err != nil {
			return
		}
		if !api.CheckpointKindValid(kind) || !json.Valid(state) || len(name) > MaxCheckpointName ||
			(kind == api.CheckpointNamed && name == "") || (kind == api.CheckpointMicro && name != "") {
			t.Fatalf("%q %q: kind %q name %q state %q", verb, arg, kind, name, state)
		}
	})
}
