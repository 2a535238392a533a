package builtin

import (
	"context"
	"encoding/json"
)

// Progress is how a long-running builtin reports how far it is and saves
// checkpoints. The execute stage puts one in the tool's context; a tool that
// checkpoints resumes from Resumed when it is restarted on another worker.
type Progress interface {
	// Report records progress (0-100) and a short message.
	Report(percent float64, message string)
	// Checkpoint saves state; a tool should stop when it fails, since a
	// restart could not resume from this point.
	Checkpoint(state json.RawMessage) error
	// Resumed is the state of the last checkpoint of an earlier, interrupted
	// run, or nil when this run starts from the beginning.
	Resumed() json.RawMessage
}

type progressKey struct{}

// WithProgress returns ctx carrying p.
func WithProgress(ctx context.Context, p Progress) context.Context {
	return context.WithValue(ctx, progressKey{}, p)
}

// ProgressFrom returns the Progress in ctx, or one that records nothing.
func ProgressFrom(ctx context.Context) Progress {
	if p, ok := ctx.Value(progressKey{}).(Progress); ok {
		return p
	}
	return noProgress{}
}

type noProgress struct{}

func (noProgress) Report(float64, string)           {}
func (noProgress) Checkpoint(json.RawMessage) error { return nil }
func (noProgress) Resumed() json.RawMessage         { return nil }
