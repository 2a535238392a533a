package control

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/kvstore"
)

// WithAuditChainKey lets the receipt endpoint prove receipts: pub is
// audit-chain.pub, which the checkpoints are checked with before a proof
// is answered.
func WithAuditChainKey(pub ed25519.PublicKey) Option {
	return func(h *handlers) { h.chainKey = pub }
}

// receipt answers an invocation's receipt (the terminal result's, kept in
// its status record) and, once a checkpoint covers its terminal audit
// event, the event's inclusion proof (docs/audit.md#receipts). An agent
// gets only its own calls' receipts (E3260, audited), and of the
// checkpoint that proves one only its signed head.
func (h *handlers) receipt() request[api.ReceiptRequest] {
	return request[api.ReceiptRequest]{
		expected: `{"tenant_id":…, "invocation_id":…}`, scopedExpected: `{"invocation_id":…}`,
		tenant:   func(r *api.ReceiptRequest) *string { return &r.TenantID },
		complete: func(r *api.ReceiptRequest) bool { return r.InvocationID != "" },
		do:       h.doReceipt,
	}
}

func (h *handlers) doReceipt(r api.ReceiptRequest, v viewer) (any, error) {
	if err := checkNames(r.TenantID, r.InvocationID); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := h.store.Status(ctx, r.TenantID, r.InvocationID)
	if errors.Is(err, kvstore.ErrNotFound) {
		err = noReceipt(r.InvocationID, "no such invocation")
	}
	if err != nil {
		return nil, err
	}
	if !v.sees(rec.Agent) {
		return nil, h.notOwn(v, "receipt", r.TenantID, r.InvocationID, "")
	}
	if rec.Response == nil || rec.Response.Receipt == nil {
		return nil, noReceipt(r.InvocationID, "it has not ended, or ended without one")
	}
	out := api.ReceiptResponse{Receipt: rec.Response.Receipt}
	if h.chainKey == nil || h.js == nil {
		out.Pending = "this control service holds no audit chain key to prove it with"
		return out, nil
	}
	p, err := auditchain.Prove(ctx, auditchain.Bus{JS: h.js, NoConsumers: true}, out.Receipt.EventID, h.chainKey)
	switch {
	case errors.Is(err, auditchain.ErrNotCovered):
		out.Pending = "no checkpoint covers its terminal event yet"
		return out, nil
	case err != nil:
		return nil, api.WrapError(err, api.InternalError, api.EInternal, "proving the receipt of %s: %v", r.InvocationID, err)
	}
	if v.who != "" {
		// A caller from a tenant's account gets its checkpoint's signed
		// head, not its listing, which names every event it covers,
		// other tenants' calls among them. Before version 3 the signature
		// covers the listing: there is no head to give.
		head := p.Checkpoint.Head()
		if head == nil {
			out.Pending = "its checkpoint signs the ids and tenants of every event it covers (version " + strconv.Itoa(p.Checkpoint.V) +
				"), other tenants' calls among them: an auditor or the operator gets the proof"
			return out, nil
		}
		p.Checkpoint = head
	}
	if out.Proof, err = json.Marshal(p); err != nil {
		return nil, err
	}
	return out, nil
}

func noReceipt(id, why string) error {
	return api.NewError(api.InvocationNotFound, api.EReceiptNotFound, "no receipt for invocation %q: %s", id, why)
}
