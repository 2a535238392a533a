package control

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// checkpointStore is what the checkpoints endpoints read and delete
// (*kvstore.Store).
type checkpointStore interface {
	ListCheckpoints(ctx context.Context, tenant, inv string) ([]api.Checkpoint, error)
	CheckpointMeta(ctx context.Context, tenant, id string) (api.Checkpoint, error)
	LoadCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, json.RawMessage, error)
	DeleteCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, error)
}

// checkpointsRequest decodes and checks a checkpoints request on tenant's
// endpoint; ok is false when it has been answered with an error.
func checkpointsRequest(tenant string, req micro.Request, needID bool) (r api.CheckpointsRequest, ok bool) {
	if len(req.Data()) > 0 {
		if err := decode(req.Data(), &r); err != nil {
			respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid,
				`expected {"invocation_id":…} or {"checkpoint_id":…}`))
			return r, false
		}
	}
	if !sameTenant(req, tenant, &r.TenantID) {
		return r, false
	}
	if needID && r.CheckpointID == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"checkpoint_id":…}`))
		return r, false
	}
	if needID {
		if _, _, err := kvstore.ParseCheckpointID(r.CheckpointID); err != nil {
			respondError(req, err)
			return r, false
		}
	}
	if r.InvocationID != "" {
		if err := subjects.CheckID(r.InvocationID); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
			return r, false
		}
	}
	return r, true
}

// tenantCheckpointsList lists the tenant's checkpoints, of one invocation
// or all.
func (h *handlers) tenantCheckpointsList(tenant string, req micro.Request) {
	r, ok := checkpointsRequest(tenant, req, false)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := h.store.ListCheckpoints(ctx, r.TenantID, r.InvocationID)
	if err != nil {
		respondError(req, err)
		return
	}
	// An agent lists only its own calls' checkpoints: each invocation's
	// record says whose it is, read once per invocation.
	if v := viewerOf(req); !v.all {
		own := map[string]bool{}
		kept := list[:0]
		for _, cp := range list {
			ok, seen := own[cp.InvocationID]
			if !seen {
				ok = h.ownOnly(ctx, v, r.TenantID, cp.InvocationID)
				own[cp.InvocationID] = ok
			}
			if ok {
				kept = append(kept, cp)
			}
		}
		list = kept
	}
	_ = req.RespondJSON(list)
}

// tenantCheckpointsGet describes one checkpoint, with its state when asked.
func (h *handlers) tenantCheckpointsGet(tenant string, req micro.Request) {
	r, ok := checkpointsRequest(tenant, req, true)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !h.ownCheckpoint(ctx, req, "checkpoints.get", r) {
		return
	}
	var out api.CheckpointState
	var err error
	if r.WithState {
		out.Checkpoint, out.State, err = h.store.LoadCheckpoint(ctx, r.TenantID, r.CheckpointID)
	} else {
		out.Checkpoint, err = h.store.CheckpointMeta(ctx, r.TenantID, r.CheckpointID)
	}
	if err != nil {
		respondError(req, err)
		return
	}
	// The reply is one message: a state too large for it is left out.
	if max := h.nc.MaxPayload(); max > 0 && int64(len(out.State))+4096 > max {
		out.State = nil
		respondError(req, api.NewError(api.ResourceExhausted, api.ECheckpointRestore,
			"checkpoint %s holds %d bytes, more than one reply carries (%d)", r.CheckpointID, out.StateBytes, max))
		return
	}
	_ = req.RespondJSON(out)
}

// tenantCheckpointsDelete deletes one checkpoint.
func (h *handlers) tenantCheckpointsDelete(tenant string, req micro.Request) {
	r, ok := checkpointsRequest(tenant, req, true)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !h.ownCheckpoint(ctx, req, "checkpoints.delete", r) {
		return
	}
	cp, err := h.store.DeleteCheckpoint(ctx, r.TenantID, r.CheckpointID)
	if err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(cp)
}

// ownCheckpoint reports whether the caller of req may see checkpoint
// r.CheckpointID, a checkpoint of its own agent's call; otherwise it has
// answered: not found as the store says, or E3260.
func (h *handlers) ownCheckpoint(ctx context.Context, req micro.Request, endpoint string, r api.CheckpointsRequest) bool {
	v := viewerOf(req)
	if v.all {
		return true
	}
	meta, err := h.store.CheckpointMeta(ctx, r.TenantID, r.CheckpointID)
	if err != nil {
		respondError(req, err)
		return false
	}
	if !h.ownOnly(ctx, v, r.TenantID, meta.InvocationID) {
		respondError(req, h.notOwn(v, endpoint, r.TenantID, meta.InvocationID, r.CheckpointID))
		return false
	}
	return true
}
