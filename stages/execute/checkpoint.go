package execute

import (
	"context"
	"encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/builtin"
	"github.com/toolgate/toolgate/subjects"
	"strconv"
	"sync"
	"time"
)

// progressEvery spaces progress writes to the invocation record.
const progressEvery = 250 * time.Millisecond

// CheckpointCreated is the data of a tool.checkpoint.created audit event.
type CheckpointCreated struct {
	InvocationID string  `json:"invocation_id"`
	TenantID     string  `json:"tenant_id"`
	ToolID       string  `json:"tool_id"`
	Seq          int     `json:"seq"`
	StoredBytes  int     `json:"stored_bytes"`
	StateBytes   int     `json:"state_bytes"`
	Percent      float64 `json:"percent"`
}

// tracker is the builtin.Progress of one invocation: checkpoints go to KV
// and are announced on the audit stream as they happen; progress goes to
// the invocation record, at most every progressEvery.
type tracker struct {
	ctx     context.Context
	store   store
	publish func(context.Context, stages.Output) error
	inv     *envelope.Invocation
	toolID  string
	resumed json.RawMessage

	mu       sync.Mutex
	seq      int
	percent  float64
	lastSave time.Time
}

var _ builtin.Progress = (*tracker)(nil)

func (t *tracker) Resumed() json.RawMessage { return t.resumed }

// checkpointed reports whether this run saved or resumed from a checkpoint.
func (t *tracker) checkpointed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seq > 0
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

func (t *tracker) Checkpoint(state json.RawMessage) error {
	t.mu.Lock()
	t.seq++
	seq, percent := t.seq, t.percent
	t.mu.Unlock()
	now := time.Now().UTC()
	n, err := t.store.SaveCheckpoint(t.ctx, t.inv.Tenant, t.inv.ID, kvstore.Checkpoint{Seq: seq, CreatedAt: now, State: state})
	if err != nil {
		return err
	}
	_, err = t.store.UpdateRecord(t.ctx, t.inv.Tenant, t.inv.ID, func(r *api.Record) {
		r.Checkpoint = &api.CheckpointRef{Seq: seq, Bytes: n, CreatedAt: now}
	})
	if err != nil {
		return err
	}
	if t.publish == nil {
		return nil
	}
	ev, err := stages.AuditEvent(subjects.Execute, t.inv, api.TypeCheckpointCreated, CheckpointCreated{
		InvocationID: t.inv.ID, TenantID: t.inv.Tenant, ToolID: t.toolID, Seq: seq,
		StoredBytes: n, StateBytes: len(state), Percent: percent,
	})
	if err != nil {
		return err
	}
	ev.MsgID = ev.MsgID + "." + strconv.Itoa(seq) // one event per checkpoint
	// The run's context allows up to an hour: a lost publish ack must not
	// hold the tool that long.
	pctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
	defer cancel()
	return t.publish(pctx, ev)
}
