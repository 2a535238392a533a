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
	if !r.Replace || digest == "" || r.AcceptDigest != "" {
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
			"review the change with `toolgate tools get %s --version %s`, then `toolgate tools accept %s@%s --digest %s`",
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

// acceptable checks a register that accepts a held change: it replaces,
// the change held for the version has the digest it names, and so does
// its manifest. The operator signs the manifest that is then served, so
// readers honour it as any registration. Any other register passes.
func (h *handlers) acceptable(ctx context.Context, req micro.Request, r api.RegisterRequest) bool {
	if r.AcceptDigest == "" {
		return true
	}
	m, err := tools.Parse(r.Manifest)
	if err != nil {
		respondError(req, err)
		return false
	}
	if !r.Replace {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "accept_digest replaces a version: set replace"))
		return false
	}
	rec, err := h.store.Tool(ctx, m.ID, m.Version)
	if err != nil {
		respondError(req, err)
		return false
	}
	switch p := rec.Pending; {
	case p == nil:
		respondError(req, api.NewError(api.StateConflict, api.EToolChangeNone, "no change of tool %s version %s is held", m.ID, m.Version))
		return false
	case p.Digest != r.AcceptDigest || tooldesc.Pinned(r.Manifest) != r.AcceptDigest:
		e := api.NewError(api.StateConflict, api.EToolChangeDigest,
			"the change held for tool %s version %s has digest %s, not %s", m.ID, m.Version, p.Digest, r.AcceptDigest)
		e.Details = map[string]any{"digest": p.Digest}
		respondError(req, e)
		return false
	}
	return true
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
