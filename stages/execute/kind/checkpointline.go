package kind

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/toolgate/toolgate/api"
)

// MaxCheckpointName bounds the name of a macro or named checkpoint.
const MaxCheckpointName = 128

// ParseCheckpoint reads a checkpoint control line (cli tools write them on
// stdout, MCP tools as the message of a progress notification):
//
//	toolgate:checkpoint {"next":5}                  a micro checkpoint
//	toolgate:checkpoint.macro parsed {"next":5}     a milestone (name optional)
//	toolgate:checkpoint.named before-upload {...}   kept until deleted
func ParseCheckpoint(verb string, arg []byte) (kind, name string, state json.RawMessage, err error) {
	kind = api.CheckpointMicro
	switch verb {
	case "checkpoint.macro":
		kind = api.CheckpointMacro
	case "checkpoint.named":
		kind = api.CheckpointNamed
	}
	if kind != api.CheckpointMicro && len(arg) > 0 && arg[0] != '{' && arg[0] != '[' {
		n, rest, _ := bytes.Cut(arg, []byte(" "))
		name, arg = string(n), bytes.TrimSpace(rest)
	}
	switch {
	case kind == api.CheckpointNamed && name == "":
		return "", "", nil, errors.New("a named checkpoint needs a name before its state")
	case len(name) > MaxCheckpointName || !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return "", "", nil, fmt.Errorf("a checkpoint name is up to %d printable bytes", MaxCheckpointName)
	case !json.Valid(arg):
		return "", "", nil, errors.New("the checkpoint state is not JSON")
	}
	return kind, name, bytes.Clone(arg), nil
}
