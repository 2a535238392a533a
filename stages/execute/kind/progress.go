package kind

import (
	"context"
	"encoding/json"
)

// Progress is how a long-running tool of any kind reports how far it is
// and saves checkpoints. The execute stage puts one in the tool's context;
// a tool that checkpoints resumes from Resumed when it is restarted on
// another worker.
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

// Checkpointer is the Progress of a run that stores checkpoints of every
// kind (docs/checkpoints.md): Save writes a macro checkpoint (a milestone,
// name optional) or a named one at once and returns its id, where
// Progress.Checkpoint offers a micro one, written at most once per the
// call's checkpoint interval.
type Checkpointer interface {
	Save(kind, name string, state json.RawMessage) (id string, err error)
}

// SaveCheckpoint stores a macro or named checkpoint through the Progress in
// ctx; it returns "" and no error where nothing stores checkpoints.
func SaveCheckpoint(ctx context.Context, kind, name string, state json.RawMessage) (string, error) {
	if c, ok := ProgressFrom(ctx).(Checkpointer); ok {
		return c.Save(kind, name, state)
	}
	return "", nil
}
