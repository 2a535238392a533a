// Package clitool runs cli tools: a command run in a sandbox (no network
// unless granted, a read-only filesystem but for granted paths, CPU, memory,
// pids and time limits, the process group killed on timeout or cancel).
package clitool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strconv"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Kind runs cli tools.
type Kind struct {
	// Sandbox runs the commands; SandboxErr, when set, says why it cannot,
	// and every cli tool is refused with it.
	Sandbox    sandbox.Config
	SandboxErr error
}

var _ execute.Kind = (*Kind)(nil)

// ResumeFile is where, in its work directory, a cli tool restarted after an
// interruption finds the state of its last checkpoint; the environment
// variable TOOLGATE_RESUME holds its path.
const ResumeFile = "toolgate-resume.json"

// Prepare implements execute.Kind: a sandboxed run of a command-line tool.
// The tool reports progress and checkpoints with control lines on stdout
// (sandbox.ControlPrefix).
func (k *Kind) Prepare(m *tools.Manifest, inv *envelope.Invocation) (kind.Func, error) {
	if k.SandboxErr != nil {
		return nil, api.NewError(api.SandboxFailure, api.EExecutorUnavailable,
			"cli tools are refused here: %v (an operator may choose --sandbox none, which does not isolate)", k.SandboxErr)
	}
	cfg, err := Decode(m)
	if err != nil {
		return nil, api.WrapError(err, api.ToolExecutionError, api.EExecutorUnavailable, "%v", err)
	}
	var grants envelope.Grants
	if inv.Authz != nil {
		grants = inv.Authz.Grants
	}
	base, err := k.Sandbox.Build(sandbox.Request{Manifest: m, Grants: grants, Env: cfg.Env, Network: cfg.Network})
	if err != nil {
		return nil, err
	}
	base.Limits.Wall = execute.Limit(m, inv.Request)
	if rl := inv.Request.ResourceLimits; rl != nil && rl.MemoryMBLimit > 0 && (base.Limits.MemoryMB == 0 || int64(rl.MemoryMBLimit) < base.Limits.MemoryMB) {
		base.Limits.MemoryMB = int64(rl.MemoryMBLimit) // narrowed, never widened
	}
	base.Limits.CPUMillicores = execute.CPUShare(m, inv.Request)
	return func(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
		argv, err := sandbox.Expand(cfg.Command, params, cfg.Operands...)
		if err != nil {
			return nil, err
		}
		spec := base
		spec.Argv = argv
		docs, removeDocs, err := docFiles(m, params)
		if err != nil {
			return nil, err
		}
		defer removeDocs()
		if docs != "" {
			spec = withDocs(k.Sandbox, spec, docs)
		}
		if cfg.Stdin != "none" {
			spec.Stdin = params
		}
		progress := kind.ProgressFrom(ctx)
		if state := progress.Resumed(); state != nil {
			spec.Files = map[string][]byte{ResumeFile: state}
			spec.Env = maps.Clone(spec.Env)
			if spec.Env == nil {
				spec.Env = map[string]string{}
			}
			spec.Env["TOOLGATE_RESUME"] = "/work/" + ResumeFile
			if k.Sandbox.Mode == sandbox.ModeNone {
				// Unconfined, the work directory is a temporary one of
				// the host's, the one the tool starts in.
				spec.Env["TOOLGATE_RESUME"] = ResumeFile
			}
		}
		var ctlErr error
		spec.Control = func(verb string, arg []byte) {
			switch verb {
			case "progress":
				pct, msg, _ := strings.Cut(string(arg), " ")
				if f, err := strconv.ParseFloat(pct, 64); err == nil && f >= 0 && f <= 100 {
					progress.Report(f, msg)
				}
			case "checkpoint", "checkpoint.macro", "checkpoint.named":
				cpKind, name, state, err := kind.ParseCheckpoint(verb, arg)
				if err != nil {
					if ctlErr == nil {
						ctlErr = api.WrapError(err, api.CheckpointFailed, api.ECheckpointCreate, "%s wrote a bad checkpoint line: %v", m.Key(), err)
					}
					return
				}
				if cpKind == api.CheckpointMicro {
					err = progress.Checkpoint(state)
				} else {
					_, err = kind.SaveCheckpoint(ctx, cpKind, name, state)
				}
				if err != nil && ctlErr == nil {
					var e *api.Error
					if !errors.As(err, &e) {
						e = api.WrapError(err, api.CheckpointFailed, api.ECheckpointCreate, "saving a checkpoint of %s: %v", m.Key(), err)
					}
					ctlErr = e
				}
			}
		}
		res, err := sandbox.Run(ctx, k.Sandbox, spec)
		meter := kind.MeterFrom(ctx)
		meter.AddResources(res.CPU, res.MaxRSSKB, spec.Network, res.NetIn, res.NetOut)
		why := "no cgroup delegated to toolgate"
		if k.Sandbox.CPUErr != nil {
			why = k.Sandbox.CPUErr.Error()
		}
		meter.NoteCPUShare(res.CPUShare, why)
		if err == nil {
			err = ctlErr
		}
		if err != nil {
			return nil, err
		}
		out := bytes.TrimSpace(res.Stdout)
		if !json.Valid(out) {
			return nil, api.NewError(api.ToolExecutionError, api.EResultNotJSON, "%s wrote no JSON on stdout", m.Key())
		}
		return out, nil
	}, nil
}
