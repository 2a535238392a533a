package kvstore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// --- revocations -----------------------------------------------------------

// Revocation is a revocations bucket record.
type Revocation struct {
	RevokedAt time.Time `json:"revoked_at"`
	Until     time.Time `json:"until"`
	Reason    string    `json:"reason,omitempty"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// Proof is the operator's signed revoke request; readers on an
	// authenticated bus honour no revocation without one
	// (internal/signedstate).
	Proof *api.DecisionProof `json:"proof,omitempty"`
}

// CheckRevocation judges a revocation record before a watch honours it: a
// non-nil error ignores the record (Options.CheckRevocation).
type CheckRevocation func(rec Revocation, jti string, revision uint64) error

// Revoke records that the token with id jti is revoked until until (its
// expiry: after that it is refused anyway and the entry expires), by whom
// (the operator's authenticated identity), why, and the operator's signed
// request (proof, nil on a bus without authentication).
func (s *Store) Revoke(ctx context.Context, jti string, until time.Time, reason, by string, proof *api.DecisionProof) error {
	ttl := time.Until(until)
	if ttl < time.Second {
		ttl = time.Second
	}
	val, _ := json.Marshal(Revocation{RevokedAt: time.Now().UTC(), Until: until.UTC(), Reason: reason, RevokedBy: by, Proof: proof})
	key := subjects.Token(jti)
	_, err := s.revocations.Create(ctx, key, val, jetstream.KeyTTL(ttl))
	if !errors.Is(err, jetstream.ErrKeyExists) || proof == nil {
		return err // nil when revoked already, on a bus that signs nothing
	}
	// What the key holds may be a record no operator signed, which readers
	// ignore (the control role may write the bucket): the signed one
	// replaces it, or else such a record would block the revocation. The
	// key lives to the later of the two untils.
	e, err := s.revocations.Get(ctx, key)
	if err != nil {
		return err
	}
	var old Revocation
	if json.Unmarshal(e.Value(), &old) == nil && time.Until(old.Until) > ttl {
		ttl = time.Until(old.Until)
	}
	_, err = s.js.PublishMsg(ctx, &nats.Msg{Subject: subjects.BucketKey(BucketRevocations, key), Data: val},
		jetstream.WithExpectLastSequencePerSubject(e.Revision()), jetstream.WithMsgTTL(ttl))
	return err
}

// WatchRevocations calls revoked(jti, true) for every revoked token and
// revoked(jti, false) when a revocation's token has expired (the record's
// until has passed). It returns once the current set has been delivered.
//
// Nothing un-revokes a token: a revocation stands until its until, and
// the revoke endpoint has no undo. A removal of the record before then
// (a delete or purge written with the bucket's write right, which the
// control role holds) is ignored and reported to ignored (may be nil) with
// its revision; a key whose last entry is such a removal when the watch
// starts counts as revoked. A reader that starts after every trace of the
// key is gone (a purge that itself expired) cannot know of it: that needs
// a revocation log nobody but the operator can remove from.
//
// With Options.CheckRevocation set, a record it refuses (one no operator
// signed) is ignored: the bucket's write right alone revokes nothing.
func (s *Store) WatchRevocations(ctx context.Context, revoked func(jti string, on bool), ignored func(jti string, rev uint64)) error {
	var mu sync.Mutex
	until := map[string]time.Time{} // zero: until this process ends
	err := s.watch(ctx, s.revocations, func(e jetstream.KeyValueEntry) {
		jti, err := subjects.Untoken(e.Key())
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if e.Operation() == jetstream.KeyValuePut {
			var r Revocation
			_ = json.Unmarshal(e.Value(), &r)
			if s.checkRevocation != nil && s.checkRevocation(r, jti, e.Revision()) != nil {
				return // what this reader honours for the key stands
			}
			if u, seen := until[jti]; seen && (u.IsZero() || u.After(r.Until)) {
				r.Until = u // a later record never shortens a revocation
			}
			until[jti] = r.Until
			revoked(jti, true)
			return
		}
		u, seen := until[jti]
		if !seen {
			return // nothing this reader knows of was revoked
		}
		if u.IsZero() || time.Now().Before(u) {
			// The server's own expiry may run a moment early: not worth
			// an alarm.
			if ignored != nil && (u.IsZero() || time.Now().Add(5*time.Second).Before(u)) {
				ignored(jti, e.Revision())
			}
			return
		}
		delete(until, jti)
		revoked(jti, false)
	})
	if err != nil {
		return err
	}
	keys, err := s.keys(ctx, s.revocations, ">")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if _, err := s.revocations.Get(ctx, k); !errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		jti, err := subjects.Untoken(k)
		if err != nil {
			continue
		}
		mu.Lock()
		if _, ok := until[jti]; !ok {
			until[jti] = time.Time{}
			revoked(jti, true)
		}
		mu.Unlock()
	}
	return nil
}

// --- policies --------------------------------------------------------------

const policyKey = "active"

// PolicyBundle is the authorization policy as pushed: Rego modules by file
// name and the data document. It is stored as one value, so a worker sees a
// whole push or none of it.
type PolicyBundle struct {
	Modules  map[string]string `json:"modules"`
	Data     map[string]any    `json:"data,omitempty"`
	PushedAt time.Time         `json:"pushed_at"`
	PushedBy string            `json:"pushed_by,omitempty"`
	// Proof is the operator's signed push request that made the bundle;
	// readers on an authenticated bus honour no bundle without one
	// (internal/signedstate).
	Proof    *api.DecisionProof `json:"proof,omitempty"`
	Revision uint64             `json:"-"`
}

// PushPolicy stores b as the active policy and returns its revision. The
// caller compiles it first: the store does not judge Rego.
func (s *Store) PushPolicy(ctx context.Context, b PolicyBundle) (uint64, error) {
	return s.putBundle(ctx, policyKey, b)
}

// DeletePolicy removes the pushed bundle: workers return to their
// configured policy. Removing none is no error.
func (s *Store) DeletePolicy(ctx context.Context) error {
	err := s.policies.Delete(ctx, policyKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// Policy returns the active bundle, or ok false when none was pushed.
func (s *Store) Policy(ctx context.Context) (PolicyBundle, bool, error) {
	return s.bundle(ctx, policyKey, "policy bundle")
}

// putBundle stores b under key of the policies bucket (the live policy or
// the candidate) and returns its revision.
func (s *Store) putBundle(ctx context.Context, key string, b PolicyBundle) (uint64, error) {
	if b.PushedAt.IsZero() {
		b.PushedAt = time.Now().UTC()
	}
	val, err := json.Marshal(b)
	if err != nil {
		return 0, err
	}
	return s.policies.Put(ctx, key, val)
}

// bundle reads the bundle under key, or ok false when there is none.
func (s *Store) bundle(ctx context.Context, key, what string) (PolicyBundle, bool, error) {
	e, err := s.policies.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return PolicyBundle{}, false, nil
	}
	if err != nil {
		return PolicyBundle{}, false, err
	}
	var b PolicyBundle
	if err := json.Unmarshal(e.Value(), &b); err != nil {
		return PolicyBundle{}, false, fmt.Errorf("decoding %s: %w", what, err)
	}
	b.Revision = e.Revision()
	return b, true, nil
}

// WatchPolicy calls fn with every pushed bundle, the current one first, and
// with ok false when the bundle is deleted. It returns once the current
// bundle (if any) has been delivered.
func (s *Store) WatchPolicy(ctx context.Context, fn func(b PolicyBundle, ok bool, err error)) error {
	return s.watch(ctx, s.policies, func(e jetstream.KeyValueEntry) {
		if e.Key() != policyKey {
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			fn(PolicyBundle{}, false, nil)
			return
		}
		var b PolicyBundle
		err := json.Unmarshal(e.Value(), &b)
		b.Revision = e.Revision()
		fn(b, true, err)
	})
}

// --- approvals -------------------------------------------------------------

// Approval states; see api.Approval.
const (
	ApprovalPending   = api.ApprovalPending
	ApprovalApproved  = api.ApprovalApproved
	ApprovalDenied    = api.ApprovalDenied
	ApprovalExpired   = api.ApprovalExpired
	ApprovalCancelled = api.ApprovalCancelled
)

// Approval is a human decision on one invocation, asked for or made.
type Approval = api.Approval

func approvalKey(tenant, id string) string { return invocationKey(tenant, id) }

// RequestApproval stores a as pending unless an approval for the invocation
// exists, and returns what is stored and whether it was created.
func (s *Store) RequestApproval(ctx context.Context, a Approval) (Approval, bool, error) {
	a.State = ApprovalPending
	val, err := json.Marshal(a)
	if err != nil {
		return Approval{}, false, err
	}
	_, err = s.approvals.Create(ctx, approvalKey(a.Tenant, a.InvocationID), val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		cur, _, err := s.approval(ctx, a.Tenant, a.InvocationID)
		return cur, false, err
	}
	if err != nil {
		return Approval{}, false, fmt.Errorf("requesting approval: %w", err)
	}
	return a, true, nil
}

// ErrNoApproval matches the error of an invocation without an approval.
var ErrNoApproval = &api.Error{Code: api.InvalidParameters, ECode: api.EApprovalUnknown}

// Approval returns the approval of an invocation, or E3214 when none exists.
func (s *Store) Approval(ctx context.Context, tenant, id string) (Approval, error) {
	a, _, err := s.approval(ctx, tenant, id)
	return a, err
}

func (s *Store) approval(ctx context.Context, tenant, id string) (Approval, uint64, error) {
	e, err := s.approvals.Get(ctx, approvalKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Approval{}, 0, api.NewError(api.InvalidParameters, api.EApprovalUnknown,
			"no approval was requested for invocation %s of tenant %s", id, tenant)
	}
	if err != nil {
		return Approval{}, 0, err
	}
	var a Approval
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return Approval{}, 0, fmt.Errorf("decoding approval: %w", err)
	}
	return a, e.Revision(), nil
}

// Decide moves a pending approval to state (approved, denied or expired)
// with a compare-and-swap, so that of any number of concurrent decisions
// exactly one wins. The loser gets E3215 with the stored decision; an unknown
// invocation is E3214.
//
// check, when set, judges the pending record inside the compare-and-swap,
// so the decision is recorded on exactly the record it judged.
func (s *Store) Decide(ctx context.Context, tenant, id, state, by, reason string, proof *api.DecisionProof, check func(Approval) error) (Approval, error) {
	a, _, err := update(ctx, s.approvals, approvalKey(tenant, id), func(a *Approval, exists bool) error {
		if !exists {
			return api.NewError(api.InvalidParameters, api.EApprovalUnknown,
				"no approval was requested for invocation %s of tenant %s", id, tenant)
		}
		if a.State != ApprovalPending {
			return api.NewError(api.StateConflict, api.EApprovalDecided,
				"invocation %s was already %s by %s", id, a.State, a.DecidedBy).WithDetail("state", a.State)
		}
		if check != nil {
			if err := check(*a); err != nil {
				return err
			}
		}
		now := time.Now().UTC()
		if state == ApprovalApproved && a.Required > 1 {
			// Two-person rule: each approval is kept with its own signed
			// decision, and one person counts once.
			for _, v := range a.Approvals {
				if v.DecidedBy == by {
					return api.NewError(api.StateConflict, api.EApprovalSamePerson,
						"%s approved invocation %s already: it needs the approvals of %d different people",
						by, id, a.Required).WithDetail("approvals", len(a.Approvals)).WithDetail("approvals_required", a.Required)
				}
			}
			a.Approvals = append(a.Approvals, api.Approver{DecidedBy: by, DecidedAt: now, Reason: reason, Proof: proof})
			if len(a.Approvals) < a.Required {
				return nil // still pending
			}
		}
		a.State, a.DecidedBy, a.Reason, a.DecidedAt = state, by, reason, now
		a.Proof = proof
		return nil
	})
	var apiErr *api.Error
	switch {
	case errors.As(err, &apiErr) && apiErr.ECode == api.EApprovalUnknown:
		return Approval{}, err
	case errors.As(err, &apiErr):
		return a, err
	case err != nil:
		return Approval{}, fmt.Errorf("recording decision: %w", err)
	}
	return a, nil
}

// PendingApprovals lists the approvals still waiting for a decision.
func (s *Store) PendingApprovals(ctx context.Context) ([]Approval, error) {
	keys, err := s.keys(ctx, s.approvals, ">")
	if err != nil {
		return nil, err
	}
	var out []Approval
	for _, key := range keys {
		e, err := s.approvals.Get(ctx, key)
		if err != nil {
			continue // deleted since listed
		}
		var a Approval
		if json.Unmarshal(e.Value(), &a) == nil && a.State == ApprovalPending {
			out = append(out, a)
		}
	}
	return out, nil
}

// --- budgets ---------------------------------------------------------------

// Usage is what one session has used so far.
type Usage struct {
	// Calls counts the calls reserved, the leased ones included: a cap on
	// calls is checked against it.
	Calls int64 `json:"calls"`
	// Leases are calls reserved in advance by authorize workers, each for
	// its own next calls (see Lease).
	Leases              []Lease   `json:"leases,omitempty"`
	RuntimeMS           int64     `json:"runtime_ms"`
	Cost                float64   `json:"cost"`
	Tokens              int64     `json:"tokens"`
	ConsecutiveFailures int64     `json:"consecutive_failures"`
	UpdatedAt           time.Time `json:"updated_at,omitzero"`
	// StartedAt is the session's first charge, for its spending rate.
	StartedAt time.Time `json:"started_at,omitzero"`
	// Reserved are the invocations charged whose end is not charged yet,
	// so that a retried or re-driven charge of the same invocation is
	// recognised (tags of their ids: Reserve); Settle forgets them.
	Reserved []string `json:"reserved,omitempty"`
	// Settled are the latest invocations whose end was charged (Settle).
	Settled []string `json:"settled,omitempty"`
	// Aborted is set when an abort hook ended the session: authorize
	// refuses its later calls (E3802).
	Aborted *Abort `json:"aborted,omitempty"`
	// Holds are the tokens and cost model calls in flight may still use:
	// authorize holds them before a call runs, audit releases them when
	// it charges what the call used, so max_tokens and max_cost hold
	// whatever the calls in flight do.
	Holds []Hold `json:"holds,omitempty"`
	// Limits are the caps the latest call was admitted against (the
	// token's budget claim), so a reader can tell how near the session is
	// to them without the token (Store.Budgets).
	Limits api.BudgetLimits `json:"limits,omitzero"`
}

// Hold is what one model call in flight may use of a budget.
type Hold struct {
	ID     string  `json:"id"` // a tag of the invocation id (idTag)
	Tokens int64   `json:"tokens,omitempty"`
	Cost   float64 `json:"cost,omitempty"`
}

// Held sums the holds of the calls in flight.
func (u *Usage) Held() (tokens int64, cost float64) {
	for _, h := range u.Holds {
		tokens += h.Tokens
		cost += h.Cost
	}
	return tokens, cost
}

// Hold records what the invocation id may use.
func (u *Usage) Hold(id string, tokens int64, cost float64) {
	u.Release(id)
	u.Holds = append(u.Holds, Hold{ID: idTag(id), Tokens: tokens, Cost: cost})
}

// HoldOf returns the invocation id's hold.
func (u *Usage) HoldOf(id string) (Hold, bool) {
	tag := idTag(id)
	for _, h := range u.Holds {
		if h.ID == tag {
			return h, true
		}
	}
	return Hold{}, false
}

// Release drops the invocation id's hold, reporting whether u had one.
func (u *Usage) Release(id string) bool {
	tag := idTag(id)
	n := len(u.Holds)
	u.Holds = slices.DeleteFunc(u.Holds, func(h Hold) bool { return h.ID == tag })
	if len(u.Holds) == 0 {
		u.Holds = nil
	}
	return len(u.Holds) != n
}

// A usage remembers the latest invocations it charged, so that a retried
// charge of the same one is recognised, by a short tag of each id rather
// than the id: the record is read and written on every charge, and a
// long id list made it several kilobytes. A 72-bit tag among 64 makes a
// collision (a call taken for one already charged) vanishingly rare.
// Records written with whole ids are still recognised.
const (
	// ReservedMemory is how many reservations of calls in flight a usage
	// remembers: a call re-driven while more of its session's calls were
	// in flight may be charged again.
	ReservedMemory = 1024
	// SettledMemory is how many ended invocations a usage remembers.
	SettledMemory = 64
)

// idTag is what a usage remembers of an invocation id.
func idTag(id string) string {
	slot := &recentTags[maphash.String(tagSeed, id)%uint64(len(recentTags))]
	if t := slot.Load(); t != nil && t.id == id {
		return t.tag
	}
	sum := sha256.Sum256([]byte(id))
	tag := base64.RawURLEncoding.EncodeToString(sum[:9])
	slot.Store(&taggedID{id: id, tag: tag})
	return tag
}

// recentTags are the tags of ids tagged lately, one per slot: every look
// at a usage's lists tags the id again, and one call's charge and
// reservation look several times (authorize's, audit's, per budget key,
// and again on a compare-and-swap that retries).
var (
	recentTags [1024]atomic.Pointer[taggedID]
	tagSeed    = maphash.MakeSeed()
)

type taggedID struct{ id, tag string }

func remembers(ids []string, id string) int {
	tag := idTag(id)
	for i, x := range ids {
		if x == tag || x == id {
			return i
		}
	}
	return -1
}

func remember(ids []string, id string, most int) []string {
	ids = append(ids, idTag(id))
	if len(ids) > most {
		ids = ids[len(ids)-most:]
	}
	return ids
}

// HasReserved reports whether the invocation id was reserved on u.
func (u *Usage) HasReserved(id string) bool { return remembers(u.Reserved, id) >= 0 }

// Reserve remembers the invocation id as reserved on u.
func (u *Usage) Reserve(id string) { u.Reserved = remember(u.Reserved, id, ReservedMemory) }

// Unreserve forgets the reservation of id, reporting whether u had it.
func (u *Usage) Unreserve(id string) bool {
	i := remembers(u.Reserved, id)
	if i < 0 {
		return false
	}
	u.Reserved = slices.Delete(u.Reserved, i, i+1)
	return true
}

// HasSettled reports whether the end of the invocation id was charged to u.
func (u *Usage) HasSettled(id string) bool { return remembers(u.Settled, id) >= 0 }

// Settle remembers that the end of the invocation id was charged to u,
// and forgets its reservation.
func (u *Usage) Settle(id string) {
	u.Unreserve(id)
	u.Settled = remember(u.Settled, id, SettledMemory)
}

// Charged reports whether the invocation id was charged to u: reserved,
// or ended.
func (u *Usage) Charged(id string) bool { return u.HasReserved(id) || u.HasSettled(id) }

// Lease is a run of calls one worker reserved in advance and gives to its
// next calls without a write. Its calls count in Usage.Calls from the
// start; when it ends, its holder takes back from Calls those it did not
// give. A lease whose holder never ended it (the worker died) is dropped
// once stale, its calls all counted as made: a budget may end short of its
// cap, never over it.
type Lease struct {
	Holder string    `json:"holder"`
	Calls  int64     `json:"calls"`
	Until  time.Time `json:"until"`
}

// Leased is the number of calls in leases, given to calls or not.
func (u *Usage) Leased() int64 {
	var n int64
	for _, l := range u.Leases {
		n += l.Calls
	}
	return n
}

// Made is the number of calls made as far as the record knows: those
// reserved less those in leases (which their holders may have given since).
func (u *Usage) Made() int64 { return u.Calls - u.Leased() }

// EndLease ends holder's lease, of which unused calls were not given,
// reporting whether it had one.
func (u *Usage) EndLease(holder string, unused int64) bool {
	i := slices.IndexFunc(u.Leases, func(l Lease) bool { return l.Holder == holder })
	if i < 0 {
		return false
	}
	u.Calls -= min(max(unused, 0), u.Leases[i].Calls)
	u.Leases = slices.Delete(u.Leases, i, i+1)
	return true
}

// DropStaleLeases drops the leases that ended before stale, counting all
// their calls as made, and reports whether it dropped any.
func (u *Usage) DropStaleLeases(stale time.Time) bool {
	n := len(u.Leases)
	u.Leases = slices.DeleteFunc(u.Leases, func(l Lease) bool { return l.Until.Before(stale) })
	if len(u.Leases) == 0 {
		u.Leases = nil
	}
	return len(u.Leases) != n
}

// Abort records which invocation's hook ended a session, and when.
type Abort struct {
	InvocationID string    `json:"invocation_id"`
	Hook         string    `json:"hook"`
	At           time.Time `json:"at"`
}

func budgetKey(tenant, session string) string { return invocationKey(tenant, session) }

// Usage returns a session's usage; an unknown session has used nothing.
func (s *Store) Usage(ctx context.Context, tenant, session string) (Usage, error) {
	u, _, err := s.usage(ctx, tenant, session)
	return u, err
}

// RecentUsage returns a session's usage as this process last wrote or read
// it, reading it only when it holds none. It may lag writes by other
// processes: a caller that decides on it writes with UpdateUsage, whose
// compare-and-swap starts from the same revision and so is refused, and
// decided again on a fresh read, when another process wrote since. The
// slices of the usage returned are shared with later calls: read them
// only.
func (s *Store) RecentUsage(ctx context.Context, tenant, session string) (Usage, error) {
	if r := recentOf(s.budgets); r != nil {
		key := budgetKey(tenant, session)
		if w, ok := r.get(key); ok {
			if w.usage != nil {
				return *w.usage, nil
			}
			u := new(Usage)
			if decodeOwn(w.val, u) == nil {
				r.keepUsage(key, w.rev, u)
				return *u, nil
			}
		}
	}
	return s.Usage(ctx, tenant, session)
}

func (s *Store) usage(ctx context.Context, tenant, session string) (Usage, uint64, error) {
	e, err := s.budgets.Get(ctx, budgetKey(tenant, session))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Usage{}, 0, nil
	}
	if err != nil {
		return Usage{}, 0, err
	}
	var u Usage
	if err := json.Unmarshal(e.Value(), &u); err != nil {
		return Usage{}, 0, fmt.Errorf("decoding usage: %w", err)
	}
	// authorize reads the usage for its policy, then reserves a call on
	// it: the reservation starts from this read (recent.go).
	if r := recentOf(s.budgets); r != nil {
		r.put(e.Key(), e.Revision(), e.Value(), nil)
	}
	return u, e.Revision(), nil
}

// UpdateUsage applies change to a session's usage with compare-and-swap and
// returns the stored result. If change returns an error nothing of it is
// written and the error is returned.
//
// Concurrent updates of one session in this process share a
// compare-and-swap: the first caller writes, and the calls that arrive
// meanwhile wait and go together in the next write, each change applied in
// turn to what the ones before it left. A key that many calls charge at
// once thus costs one round trip per batch, not a conflict per call; the
// compare-and-swap still orders the batches of all processes. The Usage
// returned is the value written by the caller's batch.
func (s *Store) UpdateUsage(ctx context.Context, tenant, session string, change func(*Usage) error) (Usage, error) {
	key := budgetKey(tenant, session)
	call := &usageCall{change: change, done: make(chan struct{})}
	s.usageMu.Lock()
	if s.usageBatches == nil {
		s.usageBatches = map[string]*usageBatch{}
	}
	if b, busy := s.usageBatches[key]; busy {
		b.waiting = append(b.waiting, call)
		s.usageMu.Unlock()
		<-call.done
		if !call.lead {
			return call.u, call.err
		}
	} else {
		s.usageBatches[key] = &usageBatch{}
		s.usageMu.Unlock()
		call.batch = []*usageCall{call}
	}
	// This call leads its batch: it writes for all of them, then hands the
	// lead to the first of those that arrived meanwhile.
	s.commitUsage(ctx, tenant, session, key, call.batch)
	s.usageMu.Lock()
	var next *usageCall
	if b := s.usageBatches[key]; len(b.waiting) == 0 {
		delete(s.usageBatches, key)
	} else {
		next = b.waiting[0]
		next.batch, next.lead, b.waiting = b.waiting, true, nil
	}
	s.usageMu.Unlock()
	for _, c := range call.batch[1:] {
		close(c.done)
	}
	if next != nil {
		close(next.done)
	}
	return call.u, call.err
}

// usageCall is one UpdateUsage waiting for, or leading, a batch.
type usageCall struct {
	change func(*Usage) error
	done   chan struct{}
	lead   bool
	batch  []*usageCall // when lead: the calls it writes for, itself first
	u      Usage
	err    error
}

// usageBatch holds the calls that arrived while a key's batch is written.
type usageBatch struct{ waiting []*usageCall }

func (s *Store) commitUsage(ctx context.Context, tenant, session, key string, batch []*usageCall) {
	u, _, err := update(ctx, s.budgets, key, func(u *Usage, _ bool) error {
		changed := false
		for _, c := range batch {
			before := *u
			before.Reserved, before.Settled, before.Leases = slices.Clone(u.Reserved), slices.Clone(u.Settled), slices.Clone(u.Leases)
			if c.err = c.change(u); c.err != nil {
				*u = before
				continue
			}
			changed = true
		}
		if !changed {
			return ErrUnchanged
		}
		u.UpdatedAt = time.Now().UTC()
		if u.StartedAt.IsZero() {
			u.StartedAt = u.UpdatedAt
		}
		return nil
	})
	for _, c := range batch {
		c.u = u
		if err != nil {
			c.u = Usage{}
			if c.err == nil {
				c.err = fmt.Errorf("updating usage of %s/%s: %w", tenant, session, err)
			}
		}
	}
}
