package execute

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/kind"
	"github.com/toolgate/toolgate/subjects"
)

// progressEvery spaces progress writes to the invocation record.
const progressEvery = 250 * time.Millisecond

// CheckpointCreated is the data of a tool.checkpoint.created audit event.
type CheckpointCreated struct {
	InvocationID string  `json:"invocation_id"`
	TenantID     string  `json:"tenant_id"`
	ToolID       string  `json:"tool_id"`
	CheckpointID string  `json:"checkpoint_id"`
	Kind         string  `json:"checkpoint_type"`
	Name         string  `json:"name,omitempty"`
	Parent       string  `json:"parent_checkpoint_id,omitempty"`
	Seq          int     `json:"seq"`
	StoredBytes  int     `json:"stored_bytes"`
	StateBytes   int     `json:"state_bytes"`
	Delta        bool    `json:"is_delta,omitempty"`
	Percent      float64 `json:"percent"`
}

// tracker is the kind.Progress of one invocation: checkpoints go to KV
// and are announced on the audit stream as they happen; progress goes to
// the invocation record, at most every progressEvery.
//
// Micro checkpoints (Checkpoint) are written at most once per interval:
// one offered sooner waits, replaced by any later one, until the interval
// has passed. Macro and named checkpoints (Save) are written at once.
type tracker struct {
	ctx     context.Context
	store   store
	publish func(context.Context, stages.Output) error
	inv     *envelope.Invocation
	toolID  string
	toolVer string
	resumed json.RawMessage
	// parent is the checkpoint the run resumed from, if any.
	parent string
	// interval spaces micro checkpoints; micro false ignores them.
	interval time.Duration
	micro    bool
	// pins, when set, gives the document versions the run has pinned.
	pins func() json.RawMessage

	mu       sync.Mutex
	seq      int
	percent  float64
	lastSave time.Time
	last     map[string]*kvstore.CheckpointParent // the run's last checkpoint of each kind
	lastID   string
	created  []api.CheckpointMetadata

	lastMicro time.Time
	pending   json.RawMessage // a micro checkpoint waiting for its interval
	timer     *time.Timer
	saveErr   error // of a micro checkpoint written by the timer
	writeMu   sync.Mutex
}

var (
	_ kind.Progress     = (*tracker)(nil)
	_ kind.Checkpointer = (*tracker)(nil)
)

func (t *tracker) Resumed() json.RawMessage { return t.resumed }

// createdList returns the checkpoints this run stored, oldest first.
func (t *tracker) createdList() []api.CheckpointMetadata {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]api.CheckpointMetadata(nil), t.created...)
}

func (t *tracker) Report(percent float64, message string) {
	t.mu.Lock()
	t.percent = percent
	due := time.Since(t.lastSave) >= progressEvery
	if due {
		t.lastSave = time.Now()
	}
	t.mu.Unlock()
	if !due {
		return
	}
	_, _ = t.store.UpdateRecord(t.ctx, t.inv.Tenant, t.inv.ID, func(r *api.Record) {
		r.Progress = &api.Progress{Percent: percent, Message: message, UpdatedAt: time.Now().UTC()}
	})
}

// Checkpoint offers a micro checkpoint.
func (t *tracker) Checkpoint(state json.RawMessage) error {
	if !t.micro {
		return nil
	}
	t.mu.Lock()
	if err := t.saveErr; err != nil {
		t.mu.Unlock()
		return err
	}
	wait := t.interval - time.Since(t.lastMicro)
	if t.lastMicro.IsZero() || wait <= 0 {
		t.lastMicro = time.Now()
		t.pending = nil
		t.mu.Unlock()
		_, err := t.Save(api.CheckpointMicro, "", state)
		return err
	}
	t.pending = state
	if t.timer == nil {
		t.timer = time.AfterFunc(wait, t.flush)
	}
	t.mu.Unlock()
	return nil
}

// flush writes the micro checkpoint waiting for its interval.
func (t *tracker) flush() {
	t.mu.Lock()
	state := t.pending
	t.pending, t.timer = nil, nil
	if state != nil {
		t.lastMicro = time.Now()
	}
	t.mu.Unlock()
	if state == nil || t.ctx.Err() != nil {
		return
	}
	if _, err := t.Save(api.CheckpointMicro, "", state); err != nil {
		t.mu.Lock()
		t.saveErr = err
		t.mu.Unlock()
	}
}

// finish stops the interval timer; when the run failed, a micro checkpoint
// still waiting is written, so that a resume starts from it.
func (t *tracker) finish(failed bool) {
	t.mu.Lock()
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	state := t.pending
	t.pending = nil
	t.mu.Unlock()
	if failed && state != nil {
		_, _ = t.save(context.WithoutCancel(t.ctx), api.CheckpointMicro, "", state)
	}
}

// Save stores a checkpoint of the given kind now and returns its id.
func (t *tracker) Save(kind, name string, state json.RawMessage) (string, error) {
	return t.save(t.ctx, kind, name, state)
}

func (t *tracker) save(ctx context.Context, kind, name string, state json.RawMessage) (string, error) {
	// One write at a time: each checkpoint's parent is the one before.
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	t.mu.Lock()
	t.seq++
	seq, percent := t.seq, t.percent
	parent := t.last[kind]
	parentID := t.lastID
	if parentID == "" {
		parentID = t.parent
	}
	if parent != nil && parent.Meta.ID != parentID {
		parentID = parent.Meta.ID // a chain runs through checkpoints of one kind
	}
	t.mu.Unlock()
	cp := api.Checkpoint{Kind: kind, Name: name, Tenant: t.inv.Tenant, InvocationID: t.inv.ID, ToolID: t.toolID,
		ToolVersion: t.toolVer, Seq: seq, Parent: parentID, Percent: percent}
	if t.pins != nil {
		cp.DocumentPins = t.pins()
	}
	cp, err := t.store.SaveCheckpoint(ctx, cp, state, parent)
	if err != nil {
		return "", err
	}
	t.mu.Lock()
	if t.last == nil {
		t.last = map[string]*kvstore.CheckpointParent{}
	}
	compact, _ := compactJSON(state)
	t.last[kind] = &kvstore.CheckpointParent{Meta: cp, State: compact}
	t.lastID = cp.ID
	t.created = append(t.created, api.CheckpointMetadata{ID: cp.ID, Kind: kind, Timestamp: cp.CreatedAt.Format(time.RFC3339Nano)})
	t.mu.Unlock()
	_, err = t.store.UpdateRecord(ctx, t.inv.Tenant, t.inv.ID, func(r *api.Record) {
		r.Checkpoint = &api.CheckpointRef{ID: cp.ID, Kind: kind, Seq: seq, Bytes: cp.StoredBytes, CreatedAt: cp.CreatedAt}
	})
	if err != nil {
		return cp.ID, err
	}
	if t.publish == nil {
		return cp.ID, nil
	}
	ev, err := stages.AuditEvent(subjects.Execute, t.inv, api.TypeCheckpointCreated, CheckpointCreated{
		InvocationID: t.inv.ID, TenantID: t.inv.Tenant, ToolID: t.toolID, CheckpointID: cp.ID, Kind: kind, Name: name,
		Parent: cp.Parent, Seq: seq, StoredBytes: cp.StoredBytes, StateBytes: cp.StateBytes, Delta: cp.Delta, Percent: percent,
	})
	if err != nil {
		return cp.ID, err
	}
	ev.MsgID = ev.MsgID + "." + strconv.Itoa(seq) // one event per checkpoint
	// The run's context allows up to an hour: a lost publish ack must not
	// hold the tool that long.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return cp.ID, t.publish(pctx, ev)
}

// compactJSON is the state as the store keeps it (no HTML escaping).
func compactJSON(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	err := json.Compact(&buf, b)
	return buf.Bytes(), err
}

// resumeFrom loads the state a run starts from: its own last checkpoint
// when an earlier run of it was interrupted, else the checkpoint the
// request names. found is false when there is neither.
func (x *Executor) resumeFrom(ctx context.Context, inv *envelope.Invocation, toolID string, tr *tracker, interrupted bool) (found bool, err error) {
	if interrupted {
		latest, ok, maxSeq, err := x.store.LatestCheckpoint(ctx, inv.Tenant, inv.ID)
		if errors.Is(err, &api.Error{Code: api.ResumeFailed, ECode: api.ECheckpointUnsigned}) {
			x.refused(ctx, "checkpoint:"+inv.Tenant+"/"+inv.ID, inv.Event.Seq, err)
			return false, err // not retried: a redelivery reads the same record
		}
		if err != nil {
			return false, stages.Transient(errors.Join(errors.New("finding the last checkpoint"), err), 0)
		}
		tr.seq = maxSeq
		if ok {
			return true, x.restoreInto(ctx, inv, toolID, tr, latest.ID)
		}
	}
	if cc := inv.Request.CheckpointConfig; cc != nil && cc.ResumeFromCheckpointID != "" {
		return true, x.restoreInto(ctx, inv, toolID, tr, cc.ResumeFromCheckpointID)
	}
	return false, nil
}

func (x *Executor) restoreInto(ctx context.Context, inv *envelope.Invocation, toolID string, tr *tracker, id string) error {
	cp, state, err := x.store.LoadCheckpoint(ctx, inv.Tenant, id)
	if errors.Is(err, &api.Error{Code: api.ResumeFailed, ECode: api.ECheckpointUnsigned}) {
		x.refused(ctx, "checkpoint:"+inv.Tenant+"/"+id, inv.Event.Seq, err)
	}
	if err != nil {
		var e *api.Error
		if errors.As(err, &e) && e.Retryable {
			return stages.Transient(err, 0)
		}
		return err
	}
	if cp.ToolID != toolID {
		return api.NewError(api.ResumeFailed, api.ECheckpointRestore,
			"checkpoint %s was saved by tool %s, not %s", id, cp.ToolID, toolID)
	}
	tr.resumed, tr.parent = state, cp.ID
	inv.Metadata.ResumedFromCheckpoint, inv.Metadata.ResumedFromCheckpointID = cp.Seq, cp.ID
	if len(cp.DocumentPins) > 0 && len(inv.DocumentPins) == 0 {
		if err := json.Unmarshal(cp.DocumentPins, &inv.DocumentPins); err != nil {
			return api.NewError(api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s: its document pins do not decode: %v", id, err)
		}
	}
	return nil
}
