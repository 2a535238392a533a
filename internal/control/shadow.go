package control

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// The shadow policy endpoints (docs/authorization.md): a candidate policy,
// stored operator-signed beside the live one, that authorize evaluates on
// every call without enforcing it; a report of where it disagreed; and
// its promotion to the live policy, or its removal.

// shadowStore is what the shadow endpoints read and write (*kvstore.Store).
type shadowStore interface {
	PushShadowPolicy(ctx context.Context, b kvstore.PolicyBundle) (uint64, error)
	ShadowPolicy(ctx context.Context) (kvstore.PolicyBundle, bool, error)
	DropShadowPolicy(ctx context.Context) error
	PushPolicy(ctx context.Context, b kvstore.PolicyBundle) (uint64, error)
}

var _ shadowStore = (*kvstore.Store)(nil)

// shadowReportMax bounds the divergence events one report reads.
const shadowReportMax = 100_000

func (h *handlers) shadowEndpoints() map[string]micro.HandlerFunc {
	return map[string]micro.HandlerFunc{
		subjects.SvcPolicyShadowPush:    h.shadowPush,
		subjects.SvcPolicyShadowGet:     h.shadowGet,
		subjects.SvcPolicyShadowDrop:    h.shadowDrop,
		subjects.SvcPolicyShadowPromote: h.shadowPromote,
		subjects.SvcPolicyShadowReport:  h.shadowReport,
	}
}

func (h *handlers) shadows(req micro.Request) (shadowStore, bool) {
	s, ok := h.admin.(shadowStore)
	if !ok {
		respondError(req, api.NewError(api.InternalError, api.EInternal, "this control service keeps no shadow policy"))
	}
	return s, ok
}

// compiled checks that a policy push request compiles, as a live policy
// must: a candidate that could not be promoted is no candidate.
func compiled(ctx context.Context, req micro.Request, r api.PolicyPushRequest) bool {
	if len(r.Modules) == 0 {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "the policy has no modules"))
		return false
	}
	if _, err := policy.New(ctx, r.Modules, r.Data); err != nil {
		respondError(req, err)
		return false
	}
	if _, err := policy.NewGrants(ctx, r.Modules, r.Data); err != nil {
		respondError(req, err)
		return false
	}
	return true
}

func (h *handlers) shadowPush(req micro.Request) {
	var r api.PolicyPushRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"modules":{"name.rego":"…"}, "data":{…}}`)
	if !ok {
		return
	}
	st, ok := h.shadows(req)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if !compiled(ctx, req, r) {
		return
	}
	rev, err := st.PushShadowPolicy(ctx, kvstore.PolicyBundle{Modules: r.Modules, Data: r.Data, PushedBy: who, Proof: h.proof(req)})
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeShadowPushed,
		api.AdminChange{Action: "policy.shadow.push", By: who, Revision: rev, Details: map[string]any{"modules": slices.Sorted(maps.Keys(r.Modules))}},
		api.PolicyPushResponse{Revision: rev, Modules: len(r.Modules), PushedBy: who})
}

func (h *handlers) shadowGet(req micro.Request) {
	var r struct{}
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, "{}"); !ok {
		return
	}
	st, ok := h.shadows(req)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	b, ok, err := h.candidate(ctx, st)
	if err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(bundleOut(b, ok))
}

// candidate reads the candidate in force, or ok false when there is none.
// On an authenticated bus it must carry an operator's signed push request
// for exactly what it holds: the control role may write the policies
// bucket, and a candidate it wrote there must not be shown as the
// operator's, nor promoted by the operator's own signature (E3240,
// audited).
func (h *handlers) candidate(ctx context.Context, st shadowStore) (kvstore.PolicyBundle, bool, error) {
	b, ok, err := st.ShadowPolicy(ctx)
	if err != nil || !ok || h.stateProof == nil {
		return b, ok, err
	}
	if err := signedstate.ShadowPolicy(b, h.stateProof); err != nil {
		h.refusedState(ctx, "shadow policy", b.Revision, err)
		return b, false, api.WrapError(err, api.PermissionDenied, api.EShadowUnsigned,
			"the candidate policy (revision %d) is not one an operator pushed: %v; push it again or drop it", b.Revision, err)
	}
	return b, true, nil
}

// shadowDigest is the digest of a candidate as shown: what an operator
// reads before a promote and what the promote signs.
func shadowDigest(b kvstore.PolicyBundle) string {
	j, _ := json.Marshal(struct {
		Revision uint64            `json:"revision"`
		PushedAt time.Time         `json:"pushed_at"`
		PushedBy string            `json:"pushed_by"`
		Modules  map[string]string `json:"modules"`
		Data     map[string]any    `json:"data"`
	}{b.Revision, b.PushedAt, b.PushedBy, b.Modules, b.Data})
	sum := sha256.Sum256(j)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func bundleOut(b kvstore.PolicyBundle, ok bool) api.PolicyBundle {
	if !ok {
		return api.PolicyBundle{}
	}
	return api.PolicyBundle{Pushed: true, Revision: b.Revision, PushedAt: b.PushedAt, PushedBy: b.PushedBy, Modules: b.Modules, Data: b.Data,
		Digest: shadowDigest(b)}
}

func (h *handlers) shadowDrop(req micro.Request) {
	var r struct {
		By string `json:"by,omitempty"`
	}
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, "{}")
	if !ok {
		return
	}
	st, ok := h.shadows(req)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if err := st.DropShadowPolicy(ctx); err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeShadowDropped, api.AdminChange{Action: "policy.shadow.drop", By: who}, struct{}{})
}

// shadowPromote makes the candidate the live policy. The signed request
// names the candidate's modules and data and the digest of the candidate
// as the operator was shown it (the CLI reads them first), so the live
// bundle it writes carries an operator's signature over exactly what it
// holds (signedstate.Policy); a candidate changed meanwhile (E3241), or
// one no operator pushed (E3240), is refused.
func (h *handlers) shadowPromote(req micro.Request) {
	var r api.PolicyPushRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"modules":{…}, "data":{…}} (the candidate's)`)
	if !ok {
		return
	}
	st, ok := h.shadows(req)
	if !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	cand, ok, err := h.candidate(ctx, st)
	if err != nil {
		respondError(req, err)
		return
	}
	if ok && (r.CandidateDigest != "" || h.identify != nil) && r.CandidateDigest != shadowDigest(cand) {
		respondError(req, api.NewError(api.StateConflict, api.EShadowChanged,
			"the promote names candidate %q, the one stored now is %s (revision %d): show it again, then promote",
			r.CandidateDigest, shadowDigest(cand), cand.Revision))
		return
	}
	if !ok || !sameAsJSON(cand.Modules, r.Modules) || !sameAsJSON(cand.Data, r.Data) {
		respondError(req, api.NewError(api.StateConflict, api.ERequestInvalid,
			"the request does not name the candidate in force (none, or changed since it was read)"))
		return
	}
	if !compiled(ctx, req, r) {
		return
	}
	rev, err := st.PushPolicy(ctx, kvstore.PolicyBundle{Modules: r.Modules, Data: r.Data, PushedBy: who, Proof: h.proof(req)})
	if err != nil {
		respondError(req, err)
		return
	}
	if h.grantsWatched {
		for h.policyRev.Load() < rev && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err := st.DropShadowPolicy(ctx); err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeShadowPromoted,
		api.AdminChange{Action: "policy.shadow.promote", By: who, Revision: rev, Details: map[string]any{"candidate_revision": cand.Revision}},
		api.PolicyPushResponse{Revision: rev, Modules: len(r.Modules), PushedBy: who})
}

func sameAsJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// shadowReport sums up the divergences of the candidate in force (all
// recorded ones when there is none) since the request's time, or since
// the candidate was pushed.
func (h *handlers) shadowReport(req micro.Request) {
	var r api.ShadowReportRequest
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, `{"since"?}`); !ok {
		return
	}
	st, ok := h.shadows(req)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cand, has, err := h.candidate(ctx, st)
	if err != nil {
		respondError(req, err)
		return
	}
	since := time.Time{}
	if has {
		since = cand.PushedAt
	}
	if r.Since != nil {
		since = *r.Since
	}
	out, err := h.divergences(ctx, since, func(d api.ShadowDivergence) bool { return !has || d.CandidateRevision == cand.Revision })
	if err != nil {
		respondError(req, api.WrapError(err, api.InternalError, api.EInternal, "reading the audit trail: %v", err))
		return
	}
	if has {
		b := bundleOut(cand, true)
		out.Candidate = &b
	}
	_ = req.RespondJSON(out)
}

// divergences reads the policy.shadow.diverged events stored since since
// that keep selects, and counts them.
func (h *handlers) divergences(ctx context.Context, since time.Time, keep func(api.ShadowDivergence) bool) (api.ShadowReport, error) {
	out := api.ShadowReport{ByTool: []api.ShadowCount{}, ByTenant: []api.ShadowCount{}, ByRule: []api.ShadowCount{}}
	stream, err := h.js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		return out, err
	}
	state := stream.CachedInfo().State
	seq := state.FirstSeq
	if !since.IsZero() {
		if seq, err = firstAtOrAfter(ctx, stream, state.FirstSeq, state.LastSeq, since); err != nil {
			return out, err
		}
	}
	byTool, byTenant, byRule := map[string]int{}, map[string]int{}, map[string]int{}
	for n := 0; n < shadowReportMax; n++ {
		m, err := stream.GetMsg(ctx, max(seq, 1), jetstream.WithGetMsgSubject(subjects.ShadowDivergedAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, err
		}
		seq = m.Sequence + 1
		var ev struct {
			Data api.ShadowDivergence `json:"data"`
		}
		if json.Unmarshal(m.Data, &ev) != nil || !keep(ev.Data) {
			continue
		}
		d := ev.Data
		out.Diverged++
		switch {
		case d.Live.Allow && !d.Candidate.Allow:
			out.NewlyDenied++
		case !d.Live.Allow && d.Candidate.Allow:
			out.NewlyAllowed++
		}
		byTool[d.ToolID]++
		byTenant[d.TenantID]++
		byRule[cmp.Or(d.Rule, "allow")]++
	}
	out.ByTool, out.ByTenant, out.ByRule = counts(byTool), counts(byTenant), counts(byRule)
	return out, nil
}

// counts lists m by count, highest first, then by key.
func counts(m map[string]int) []api.ShadowCount {
	out := make([]api.ShadowCount, 0, len(m))
	for k, n := range m {
		out = append(out, api.ShadowCount{Key: k, Calls: n})
	}
	slices.SortFunc(out, func(a, b api.ShadowCount) int { return cmp.Or(b.Calls-a.Calls, cmp.Compare(a.Key, b.Key)) })
	return out
}
