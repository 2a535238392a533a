// Package builtin holds the tools compiled into toolgate: Go functions run
// by the execute stage for manifests of kind "builtin".
package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"time"
)

// Func runs one builtin tool: a builtin is one attempt's function, as
// every kind prepares (kind.Func).
type Func = kind.Func

// Env configures the builtins that touch the host.
type Env struct {
	// FileRoot is the directory the file builtins are confined to; empty
	// disables them.
	FileRoot string
}

// Set is a named collection of builtins.
type Set map[string]Func

// New returns the standard builtins for env.
func New(env Env) Set {
	return Set{
		"echo":           echo,
		"noop":           noop,
		"sleep":          sleep,
		"json_transform": jsonTransform,
		"read_file":      readFile(env.FileRoot),
		"write_file":     writeFile(env.FileRoot),
		"append_file":    appendFile(env.FileRoot),
		"list_dir":       listDir(env.FileRoot),
		"stat":           statFile(env.FileRoot),
		"parse_json":     parseJSON,
		"parse_yaml":     parseYAML,
		"math_eval":      mathEval,
	}
}

func invalid(format string, args ...any) error {
	return api.NewError(api.InvalidParameters, api.EParametersInvalid, format, args...)
}

// decode reads params into v, keeping numbers exact.
func decode(params json.RawMessage, v any) error {
	if len(bytes.TrimSpace(params)) == 0 {
		params = json.RawMessage(`{}`)
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return invalid("parameters: %v", err)
	}
	return nil
}

func echo(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := decode(params, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return json.RawMessage(`{}`), nil
	}
	return json.Marshal(obj)
}

func noop(context.Context, json.RawMessage) (json.RawMessage, error) {
	return json.RawMessage(`{}`), nil
}

func sleep(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	var p struct {
		MS int64 `json:"ms"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	if p.MS < 0 {
		return nil, invalid("ms must not be negative")
	}
	t := time.NewTimer(time.Duration(p.MS) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	}
	return json.Marshal(map[string]int64{"slept_ms": p.MS})
}
