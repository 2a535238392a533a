package control

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
)

// textsAdmitted scans what agents will read of the tool (internal/tooldesc)
// and refuses, audited, a manifest holding a secret or text aimed at the
// agent that it does not record as flagged (E3866, E3865). The scan is of
// the registry's own form of the manifest, whichever form was sent.
func (h *handlers) textsAdmitted(ctx context.Context, req micro.Request, who string, r api.RegisterRequest) bool {
	doc, err := tools.Native(r.Manifest)
	if err != nil {
		respondError(req, err)
		return false
	}
	bad, err := tooldesc.Check(detect.Default(), doc)
	if err != nil {
		respondError(req, err)
		return false
	}
	if len(bad) == 0 {
		return true
	}
	var id struct{ ID, Version string }
	_ = json.Unmarshal(doc, &id)
	refusal := tooldesc.Refusal(id.ID, bad).(*api.Error)
	h.refusedAudit(ctx, req, api.TypeToolRefused, api.AdminChange{Action: "tools.register", By: who, Target: id.ID + "@" + id.Version,
		Reason: refusal.Message, Details: map[string]any{"code": refusal.ECode, "findings": refusal.Details["findings"]}}, refusal)
	return false
}

// holdChange keeps an imported tool pinned: a replace whose manifest
// carries another description digest than the stored one is not stored
// but held beside it, audited, until an operator accepts it (E3869).
func (h *handlers) holdChange(ctx context.Context, req micro.Request, who string, r api.RegisterRequest, proof *api.DecisionProof) bool {
	digest := tooldesc.Pinned(r.Manifest)
	if !r.Replace || digest == "" {
		return false
	}
	m, err := tools.Parse(r.Manifest)
	if err != nil {
		return false // the store refuses it
	}
	rec, err := h.store.Tool(ctx, m.ID, m.Version)
	if err != nil || rec.Removal != nil {
		return false
	}
	pinned := tooldesc.Pinned(rec.Manifest)
	if pinned == "" || pinned == digest {
		return false
	}
	if err := h.store.HoldToolChange(ctx, m.ID, m.Version, kvstore.ToolPending{
		Manifest: r.Manifest, Digest: digest, RegisteredBy: who, Proof: proof, At: time.Now().UTC(),
	}); err != nil {
		respondError(req, err)
		return true
	}
	held := api.NewError(api.StateConflict, api.EToolChangeHeld,
		"the server of %s now lists it otherwise (digest %s, pinned %s): the pinned manifest stays served; "+
			"review the change with `toolgate tools get %s@%s`, then `toolgate tools accept %s@%s --digest %s`",
		m.ID, digest, pinned, m.ID, m.Version, m.ID, m.Version, digest)
	held.Details = map[string]any{"tool_id": m.ID, "version": m.Version, "pinned_digest": pinned, "digest": digest}
	h.refusedAudit(ctx, req, api.TypeToolDescriptionChanged, api.AdminChange{Action: "tools.register", By: who,
		Target: m.ID + "@" + m.Version, Reason: "held until an operator accepts it",
		Details: map[string]any{"code": held.ECode, "pinned_digest": pinned, "digest": digest}}, held)
	return true
}

// refusedAudit records c, then answers err: the refusal is in the trail
// before the caller learns of it.
func (h *handlers) refusedAudit(ctx context.Context, req micro.Request, typ string, c api.AdminChange, err *api.Error) {
	if aerr := h.auditAdmin(ctx, typ, c); aerr != nil {
		respondError(req, api.WrapError(aerr, api.InternalError, api.EInternal, "%s; and it could not be audited: %v", err.Message, aerr))
		return
	}
	respondError(req, err)
}

// acceptTool makes the change held for an imported tool the served
// manifest, when the operator names its digest.
func (h *handlers) acceptTool(req micro.Request) {
	who, ok := h.operator(req, "")
	if !ok {
		return
	}
	var r api.AcceptRequest
	if err := decode(req.Data(), &r); err != nil || r.ToolID == "" || r.Version == "" || r.Digest == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"tool_id":…, "version":…, "digest":…}`))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	before, err := h.store.Tool(ctx, r.ToolID, r.Version)
	if err != nil {
		respondError(req, err)
		return
	}
	p, err := h.store.AcceptToolChange(ctx, r.ToolID, r.Version, r.Digest)
	if err != nil {
		respondError(req, err)
		return
	}
	// Answer once this process's registry serves the accepted manifest.
	for ctx.Err() == nil {
		if m, err := h.reg.Resolve(r.ToolID, r.Version); err == nil && pinnedOf(m) == r.Digest {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	h.audited(ctx, req, api.TypeToolChangeAccepted, api.AdminChange{Action: "tools.accept", By: who, Target: r.ToolID + "@" + r.Version,
		Details: map[string]any{"pinned_digest": tooldesc.Pinned(before.Manifest), "digest": p.Digest, "sent_by": p.RegisteredBy}},
		api.AcceptRequest{ToolID: r.ToolID, Version: r.Version, Digest: p.Digest})
}

// pinnedOf is the description digest m was imported with.
func pinnedOf(m *tools.Manifest) string { return tooldesc.PinnedIn(m.Spec()) }

// withPending is manifest m with member pending_change added.
func withPending(m *tools.Manifest, p *api.PendingChange) (json.RawMessage, error) {
	doc, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	pb, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	// doc is an object: the member goes before its closing brace.
	return slices.Concat(doc[:len(doc)-1], []byte(`,"pending_change":`), pb, []byte("}")), nil
}

// pendingChange is the change held for m's version, or nil.
func (h *handlers) pendingChange(m *tools.Manifest) *api.PendingChange {
	if pinnedOf(m) == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, err := h.store.Tool(ctx, m.ID, m.Version)
	if err != nil || rec.Pending == nil {
		return nil
	}
	p := rec.Pending
	return &api.PendingChange{PinnedDigest: pinnedOf(m), Digest: p.Digest, By: p.RegisteredBy, At: p.At, Manifest: p.Manifest}
}
