package control

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/redact"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// The re-drive endpoints (docs/redrive.md) read the dead letters audit
// keeps and start each re-drive as a new invocation on the tenant's invoke
// subject: it passes all six stages like any call. Operators only, signed
// like the administrative endpoints; a run is audited under who signed it.

// Bounds of one listing and one run.
const (
	redriveListDefault = 100
	redriveListMax     = 10_000
)

// redriveEndpoints are the re-drive endpoints with their handlers.
func (h *handlers) redriveEndpoints() map[string]micro.HandlerFunc {
	return map[string]micro.HandlerFunc{
		subjects.SvcRedriveList: h.redriveList,
		subjects.SvcRedriveShow: h.redriveShow,
		subjects.SvcRedriveRun:  h.redriveRun,
	}
}

func (h *handlers) redriveList(req micro.Request) {
	var r api.RedriveListRequest
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, `{"tenant_id", "code"?, "since"?, "limit"?}`); !ok {
		return
	}
	if err := subjects.CheckTenant(r.Tenant); err != nil {
		respondError(req, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err))
		return
	}
	limit := r.Limit
	if limit == 0 {
		limit = redriveListDefault
	}
	if limit < 0 || limit > redriveListMax {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "limit %d: it must be 1 to %d", r.Limit, redriveListMax))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dls, more, err := h.deadLetters(ctx, r.RedriveFilter, limit)
	if err != nil {
		respondError(req, api.WrapError(err, api.InternalError, api.EInternal, "reading the dead letters: %v", err))
		return
	}
	out := api.RedriveListResponse{Entries: make([]api.RedriveEntry, 0, len(dls)), More: more}
	for _, d := range dls {
		id, st := h.redriveOf(ctx, d)
		e := api.RedriveEntry{InvocationID: d.InvocationID, Tenant: d.Tenant, ToolID: d.ToolID, EndedAt: d.EndedAt,
			RedriveID: id, RedriveStatus: st}
		if d.Error != nil {
			e.Code, e.Message = d.Error.ECode, d.Error.Message
		}
		out.Entries = append(out.Entries, e)
	}
	_ = req.RespondJSON(out)
}

func (h *handlers) redriveShow(req micro.Request) {
	var r api.RedriveShowRequest
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, `{"tenant_id", "invocation_id"}`); !ok {
		return
	}
	if err := checkNames(r.Tenant, r.InvocationID); err != nil {
		respondError(req, err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, digest, err := h.deadLetter(ctx, r.Tenant, r.InvocationID)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.RedriveShowResponse{DeadLetter: d, Digest: digest}
	out.RedriveID, out.RedriveStatus = h.redriveOf(ctx, d)
	out.Request.Parameters = redact.Redact(d.Request.Parameters)
	out.Principal = nil // claims are for authorize, not for display
	_ = req.RespondJSON(out)
}

// redriveRun starts the re-drives a signed run request asks for. Each
// dead letter has one re-drive id (subjects.RedriveID): one whose re-drive
// has a record is skipped (E3024), and one started by two runs at once is
// refused by validate as a duplicate, so a bulk run repeated after a
// partial failure runs each call once.
func (h *handlers) redriveRun(req micro.Request) {
	var r api.RedriveRunRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"tenant_id", "invocation_ids"|"filter", "capability_token_sha256"|"decision", "reason"?}`)
	if !ok {
		return
	}
	tok := req.Headers().Get(api.RedriveTokenHeader)
	bad := func(format string, args ...any) {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, format, args...))
	}
	switch {
	case subjects.CheckTenant(r.Tenant) != nil:
		bad("tenant_id %q cannot name a tenant", r.Tenant)
		return
	case len(r.IDs) == 0 && r.Filter == nil, len(r.IDs) > 0 && r.Filter != nil:
		bad("name the calls to re-drive (invocation_ids) or a filter, not both")
		return
	case r.Filter != nil && r.Filter.Tenant != r.Tenant:
		bad("the filter is for tenant %q, the run for %q", r.Filter.Tenant, r.Tenant)
		return
	case r.Decision && (tok != "" || r.TokenSHA256 != ""):
		bad("a re-drive on the operator's decision carries no token")
		return
	case r.Decision && r.Reason == "":
		bad("an operator's decision to re-drive needs a reason, which is recorded")
		return
	case !r.Decision && tok == "":
		bad("a re-drive needs the caller's capability token (header %s) or an operator's decision", api.RedriveTokenHeader)
		return
	case !r.Decision && r.TokenSHA256 != tokenDigest(tok):
		bad("the token sent is not the one the signed request names (capability_token_sha256)")
		return
	case r.Filter != nil && len(r.Digests) > 0:
		bad("a filtered run names no digests: re-drive the calls shown by id")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var dls []api.DeadLetter
	if r.Filter != nil {
		var more bool
		var err error
		if dls, more, err = h.deadLetters(ctx, *r.Filter, redriveListMax); err != nil {
			respondError(req, api.WrapError(err, api.InternalError, api.EInternal, "reading the dead letters: %v", err))
			return
		}
		if more {
			bad("the filter selects more than %d calls; narrow it", redriveListMax)
			return
		}
	}
	out := api.RedriveRunResponse{Runs: []api.RedriveRun{}}
	for _, id := range r.IDs {
		d, digest, err := h.deadLetter(ctx, r.Tenant, id)
		if err == nil {
			err = shownDeadLetter(r, id, digest, r.Decision && h.identify != nil)
		}
		if err != nil {
			if api.AsError(err).ECode == api.EDeadLetterChanged {
				h.refusedState(ctx, "dead letter", d.Seq, err)
			}
			out.Runs = append(out.Runs, api.RedriveRun{Original: id, Error: api.AsError(err)})
			continue
		}
		dls = append(dls, d)
	}
	proof := h.redriveProof(req)
	started := 0
	for _, d := range dls {
		run := api.RedriveRun{Original: d.InvocationID}
		if id, st := h.redriveOf(ctx, d); st != "" {
			// Already started: validate would refuse it as a duplicate.
			run.RedriveID = id
			run.Error = api.NewError(api.InvalidParameters, api.EDuplicateInvocation, "%s was re-driven already as %s (%s)", d.InvocationID, id, st)
			out.Runs = append(out.Runs, run)
			continue
		}
		o, id, err := redriveEvent(d, who, r, tok, proof)
		run.RedriveID = id
		if err == nil {
			err = h.publish(ctx, o)
		}
		if err != nil {
			run.Error = api.AsError(err)
		} else {
			started++
		}
		out.Runs = append(out.Runs, run)
	}
	authority := "token"
	if r.Decision {
		authority = "decision"
	}
	ids := make([]string, 0, len(out.Runs))
	for _, run := range out.Runs {
		ids = append(ids, run.Original)
	}
	h.audited(ctx, req, api.TypeRedriveRun, api.AdminChange{Action: "redrive.run", By: who, Target: r.Tenant, Reason: r.Reason,
		Details: map[string]any{"authority": authority, "started": started, "invocations": ids}}, out)
}

// shownDeadLetter checks that the dead letter id, whose digest is digest
// now, is the one the run names: the operator's decision runs only what
// the operator was shown (redrive show), and a run that names a digest,
// only that. Audit's credential may publish dead letters, so one may be
// replaced between the show and the run. required says a digest must be
// named (a decision on an authenticated bus, where the run is signed).
func shownDeadLetter(r api.RedriveRunRequest, id, digest string, required bool) error {
	want, named := r.Digests[id]
	switch {
	case !named && required:
		return api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"an operator's decision re-drives only a dead letter it names as shown: give %s's digest (redrive show)", id)
	case named && want != digest:
		return api.NewError(api.StateConflict, api.EDeadLetterChanged,
			"the dead letter of %s changed since it was shown (%s, now %s): show it again", id, want, digest)
	}
	return nil
}

// redriveProof is the signed run request each re-drive carries, without
// the token header: the signature covers the subject and body alone.
func (h *handlers) redriveProof(req micro.Request) *api.DecisionProof {
	p := h.proof(req)
	if p == nil {
		// A bus without authentication: authorize checks no proof, and
		// the re-drive still records what was asked.
		return &api.DecisionProof{Subject: req.Subject(), Headers: map[string][]string{}, Body: req.Data()}
	}
	hs := maps.Clone(p.Headers)
	delete(hs, api.RedriveTokenHeader)
	p.Headers = hs
	return p
}

func tokenDigest(tok string) string {
	if tok == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// redriveEvent is the tool.invoke event of d's re-drive.
func redriveEvent(d api.DeadLetter, who string, r api.RedriveRunRequest, tok string, proof *api.DecisionProof) (stages.Output, string, error) {
	root, depth := d.InvocationID, 1
	if prev := d.Request.Redrive; prev != nil {
		root, depth = prev.Root, prev.Depth+1
	}
	id := subjects.RedriveID(root, depth)
	req := d.Request
	req.InvocationID = id
	req.Link = nil // a hook's child re-driven is a call of its own
	req.CapabilityToken = ""
	rd := &api.Redrive{Original: d.InvocationID, Root: root, Depth: depth, By: who, Decision: r.Decision, Reason: r.Reason, Proof: proof}
	if r.Decision {
		if d.Principal == nil {
			return stages.Output{}, id, api.NewError(api.PermissionDenied, api.ERedriveRefused,
				"%s ended before its token was verified: only the caller's token can re-drive it", d.InvocationID)
		}
		rd.Principal = d.Principal
	} else {
		req.CapabilityToken = tok
	}
	req.Redrive = rd
	// A re-drive is a call of its own: an idempotency key would answer
	// with the original's result.
	if eo := req.ExecutionOptions; eo != nil {
		req.ExecutionOptions = &api.ExecutionOptions{AsyncMode: eo.AsyncMode, Priority: eo.Priority, RequireApproval: eo.RequireApproval}
	}
	source := "urn:toolgate:control"
	e, err := api.NewEvent(id, source, api.TypeInvoke, req)
	if err != nil {
		return stages.Output{}, id, err
	}
	e.Subject = req.ToolID
	hdr, body, err := e.Binary()
	if err != nil {
		return stages.Output{}, id, err
	}
	msgID := api.InvokeMsgID(d.Tenant, source, id)
	hdr[api.MsgIDHeader] = []string{msgID}
	return stages.Output{Subject: subjects.Invoke(d.Tenant), MsgID: msgID, Header: hdr, Data: body}, id, nil
}

// redriveOf names d's re-drive and its status ("" when it never ran).
func (h *handlers) redriveOf(ctx context.Context, d api.DeadLetter) (string, api.Status) {
	root, depth := d.InvocationID, 1
	if prev := d.Request.Redrive; prev != nil {
		root, depth = prev.Root, prev.Depth+1
	}
	id := subjects.RedriveID(root, depth)
	rec, err := h.store.Status(ctx, d.Tenant, id)
	if err != nil {
		return id, ""
	}
	return id, rec.Status
}

// deadLetter reads one dead letter and its digest (deadLetterDigest).
func (h *handlers) deadLetter(ctx context.Context, tenant, id string) (api.DeadLetter, string, error) {
	var d api.DeadLetter
	if err := checkNames(tenant, id); err != nil {
		return d, "", err
	}
	st, err := h.js.Stream(ctx, subjects.StreamDeadLetter)
	if err != nil {
		return d, "", err
	}
	m, err := st.GetMsg(ctx, max(st.CachedInfo().State.FirstSeq, 1), jetstream.WithGetMsgSubject(subjects.DeadLetter(tenant, id)))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return d, "", api.NewError(api.InvocationNotFound, api.EInvocationNotFound, "no dead letter of invocation %q in tenant %q", id, tenant)
	}
	if err != nil {
		return d, "", err
	}
	d.Seq = m.Sequence
	if err := h.auditWrote(ctx, m); err != nil {
		return d, "", err
	}
	if err := decode(m.Data, &d); err != nil {
		return d, "", err
	}
	d.Seq = m.Sequence
	return d, deadLetterDigest(m.Data), nil
}

// deadLetterDigest is the SHA-256 of a dead letter as stored.
func deadLetterDigest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// auditWrote checks that the audit stage wrote m: its signature over
// exactly this subject and body (audit is the one role that may publish
// dead letters). Audit's credential alone, without its key, cannot make
// one; a dead letter without it is never shown, listed or re-driven
// (E3243), and is audited.
func (h *handlers) auditWrote(ctx context.Context, m *jetstream.RawStreamMsg) error {
	if h.deadLetterSigned == nil {
		return nil // a bus without authentication signs nothing
	}
	err := h.deadLetterSigned(m.Subject, m.Header, m.Data)
	if err == nil {
		return nil
	}
	h.refusedState(ctx, "dead letter", m.Sequence, fmt.Errorf("%s: %w", m.Subject, err))
	return api.WrapError(err, api.PermissionDenied, api.EDeadLetterUnsigned,
		"the dead letter on %s was not written by the audit stage: %v", m.Subject, err)
}

// deadLetters reads up to limit dead letters f selects, oldest first;
// more says others were left.
func (h *handlers) deadLetters(ctx context.Context, f api.RedriveFilter, limit int) ([]api.DeadLetter, bool, error) {
	if err := subjects.CheckTenant(f.Tenant); err != nil {
		return nil, false, api.WrapError(err, api.InvalidParameters, api.EInvalidName, "%v", err)
	}
	st, err := h.js.Stream(ctx, subjects.StreamDeadLetter)
	if err != nil {
		return nil, false, err
	}
	var out []api.DeadLetter
	filter := subjects.DeadLetterTenant(f.Tenant)
	for seq := max(st.CachedInfo().State.FirstSeq, 1); ; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, false, nil
		}
		if err != nil {
			return out, false, err
		}
		seq = m.Sequence + 1
		var d api.DeadLetter
		if h.auditWrote(ctx, m) != nil || decode(m.Data, &d) != nil {
			continue // not one audit wrote: nothing to re-drive
		}
		d.Seq = m.Sequence
		if (f.Code != "" && (d.Error == nil || d.Error.ECode != f.Code)) || (f.Since != nil && d.EndedAt.Before(*f.Since)) {
			continue
		}
		if len(out) == limit {
			return out, true, nil
		}
		out = append(out, d)
	}
}
