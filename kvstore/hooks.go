package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// --- tenant hook sets --------------------------------------------------------

// HookSet is a tenant's hooks as pushed: the document (schemas.HookSet), who
// pushed it and when. The store does not judge hooks: the caller compiles
// them first.
type HookSet struct {
	Tenant   string          `json:"tenant"`
	Doc      json.RawMessage `json:"doc"`
	PushedAt time.Time       `json:"pushed_at"`
	PushedBy string          `json:"pushed_by,omitempty"`
	// Proof is the operator's signed push request that made the set;
	// readers on an authenticated bus honour no set without one
	// (internal/signedstate).
	Proof    *api.DecisionProof `json:"proof,omitempty"`
	Revision uint64             `json:"-"`
}

// PushHooks stores set as its tenant's hook set, replacing the one before,
// and returns its revision.
func (s *Store) PushHooks(ctx context.Context, set HookSet) (uint64, error) {
	if set.PushedAt.IsZero() {
		set.PushedAt = time.Now().UTC()
	}
	val, err := json.Marshal(set)
	if err != nil {
		return 0, err
	}
	return s.hooks.Put(ctx, subjects.Token(set.Tenant), val)
}

// DeleteHooks removes a tenant's hook set.
func (s *Store) DeleteHooks(ctx context.Context, tenant string) error {
	return s.hooks.Delete(ctx, subjects.Token(tenant))
}

// Hooks returns a tenant's hook set, ok false when none was pushed.
func (s *Store) Hooks(ctx context.Context, tenant string) (HookSet, bool, error) {
	e, err := s.hooks.Get(ctx, subjects.Token(tenant))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return HookSet{}, false, nil
	}
	if err != nil {
		return HookSet{}, false, err
	}
	var set HookSet
	if err := json.Unmarshal(e.Value(), &set); err != nil {
		return HookSet{}, false, fmt.Errorf("decoding hooks of %s: %w", tenant, err)
	}
	set.Revision = e.Revision()
	return set, true, nil
}

// WatchHooks calls fn with every tenant's hook set as stored, and with a nil
// set when one is deleted, until ctx is done. It returns once the current
// sets have been delivered.
func (s *Store) WatchHooks(ctx context.Context, fn func(tenant string, set *HookSet)) error {
	return s.watch(ctx, s.hooks, func(e jetstream.KeyValueEntry) {
		tenant, err := subjects.Untoken(e.Key())
		if err != nil {
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			fn(tenant, nil)
			return
		}
		var set HookSet
		if err := json.Unmarshal(e.Value(), &set); err != nil {
			return
		}
		set.Revision = e.Revision()
		fn(tenant, &set)
	})
}

// --- hook decisions ------------------------------------------------------------

// HookDecision is what a hook decided when an invocation ended. It is
// written once, before the outcome is published, so a redelivered audit
// repeats the first decision, and authorize admits an invocation the hook
// started only as described here.
type HookDecision struct {
	InvocationID string `json:"invocation_id"`
	Tenant       string `json:"tenant_id"`
	// Seq is the ingest sequence of the decided invocation.
	Seq     uint64 `json:"ingest_seq"`
	Hook    string `json:"hook,omitempty"`
	Source  string `json:"source,omitempty"`
	Trigger string `json:"trigger,omitempty"`
	Action  string `json:"action,omitempty"`
	// Limit is set when the hook would have passed the depth limit.
	Limit bool `json:"limit,omitempty"`
	// ConditionErrors are conditions that failed at run time.
	ConditionErrors []string `json:"condition_errors,omitempty"`
	// Child is the invocation a retry or fallback starts: its request as
	// it will be published, and the principal it is authorised as.
	Child *HookChild `json:"child,omitempty"`
	// Session is the budget key of the session an abort ended.
	Session   string    `json:"session,omitempty"`
	DecidedAt time.Time `json:"decided_at"`
	// Sig is the audit stage's signature over the decision (DecisionText):
	// audit repeats, and authorize admits a child by, only a decision
	// audit made, whoever else may write this bucket.
	Sig string `json:"sig,omitempty"`
}

// HookChild is an invocation a hook starts.
type HookChild struct {
	ID      string      `json:"id"`
	Request api.Request `json:"request"`
	// Claims are the verified capability token claims of the decided
	// invocation (never the raw token): the child is authorised as them,
	// with its own policy decision and budget charge.
	Claims json.RawMessage `json:"claims,omitempty"`
}

// DecisionText is what audit signs of a hook decision: all of it but the
// signature. Every role that writes this bucket could write a decision;
// only audit can sign one.
func DecisionText(d HookDecision) ([]byte, error) {
	d.Sig = ""
	return json.Marshal(d)
}

func hookDecisionKey(tenant, id string) string { return invocationKey(tenant, id) + ".hook" }

// RecordHookDecision stores d unless a decision on the same invocation is
// stored already, and returns the stored one: the first decision stands.
func (s *Store) RecordHookDecision(ctx context.Context, d HookDecision) (HookDecision, error) {
	if d.DecidedAt.IsZero() {
		d.DecidedAt = time.Now().UTC()
	}
	got, _, err := update(ctx, s.invocations, hookDecisionKey(d.Tenant, d.InvocationID), func(stored *HookDecision, exists bool) error {
		if exists && stored.Seq == d.Seq {
			return ErrUnchanged
		}
		*stored = d // a decision on an earlier publish of the id is replaced
		return nil
	})
	if err != nil {
		return HookDecision{}, fmt.Errorf("hook decision on %s: %w", d.InvocationID, err)
	}
	return got, nil
}

// ErrNoHookDecision reports an invocation no hook decided about.
var ErrNoHookDecision = errors.New("no hook decision")

// HookDecisionOf returns the decision stored for an invocation.
func (s *Store) HookDecisionOf(ctx context.Context, tenant, id string) (HookDecision, error) {
	e, err := s.invocations.Get(ctx, hookDecisionKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return HookDecision{}, ErrNoHookDecision
	}
	if err != nil {
		return HookDecision{}, err
	}
	var d HookDecision
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return HookDecision{}, fmt.Errorf("decoding hook decision on %s: %w", id, err)
	}
	return d, nil
}

// AbortSession marks the session under key (a budget key) as ended by an
// abort hook of invocation id; the first abort stands. The mark is made
// twice: in the session's usage, which a metered call's reservation reads
// in the same compare-and-swap, and under its own key, which authorize
// watches for the calls of trees without a budget (they read no usage).
func (s *Store) AbortSession(ctx context.Context, tenant, key, id, hook string) error {
	ab := Abort{InvocationID: id, Hook: hook, At: time.Now().UTC()}
	val, err := json.Marshal(ab)
	if err != nil {
		return err
	}
	if _, err := s.invocations.Create(ctx, abortKey(tenant, key), val); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return err
	}
	_, err = s.UpdateUsage(ctx, tenant, key, func(u *Usage) error {
		if u.Aborted != nil {
			return ErrUnchanged
		}
		u.Aborted = &ab
		return nil
	})
	if errors.Is(err, ErrUnchanged) {
		return nil
	}
	return err
}

// abortKeys prefixes the abort marks: no tenant starts with "_", so no
// status record or hook decision shares the prefix.
const abortKeys = subjects.AbortKeys

func abortKey(tenant, session string) string { return abortKeys + "." + budgetKey(tenant, session) }

// Aborts mirrors the abort marks: which sessions (token trees) an abort
// hook has ended. A mark leaves the mirror when it is deleted or when the
// bucket's TTL has expired it (expiry writes no delete the watch would
// see), so the mirror holds what the bucket holds.
type Aborts struct {
	m   sync.Map
	ttl time.Duration // the bucket's; 0 keeps marks until deleted
	now func() time.Time
	n   atomic.Int64 // marks stored since the last sweep
}

// abortSweepEvery is how many new marks trigger a sweep of expired ones.
const abortSweepEvery = 256

// Aborted reports whether the session of tenant was ended, and by what.
func (a *Aborts) Aborted(tenant, session string) (Abort, bool) {
	if a == nil {
		return Abort{}, false
	}
	key := budgetKey(tenant, session)
	v, ok := a.m.Load(key)
	if !ok {
		return Abort{}, false
	}
	ab := v.(Abort)
	if a.expired(ab) {
		a.m.CompareAndDelete(key, v)
		return Abort{}, false
	}
	return ab, true
}

func (a *Aborts) expired(ab Abort) bool {
	return a.ttl > 0 && a.clock().Sub(ab.At) > a.ttl
}

func (a *Aborts) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

func (a *Aborts) store(key string, ab Abort) {
	a.m.Store(key, ab)
	if a.n.Add(1) < abortSweepEvery {
		return
	}
	a.n.Store(0)
	a.m.Range(func(k, v any) bool {
		if a.expired(v.(Abort)) {
			a.m.CompareAndDelete(k, v)
		}
		return true
	})
}

// WatchAborts returns the abort marks, those made before included, kept
// current until ctx ends.
func (s *Store) WatchAborts(ctx context.Context) (*Aborts, error) {
	a := new(Aborts)
	if st, err := s.invocations.Status(ctx); err == nil {
		a.ttl = st.TTL()
	}
	err := s.watchKeys(ctx, s.invocations, abortKeys+".>", func(e jetstream.KeyValueEntry) {
		key, ok := strings.CutPrefix(e.Key(), abortKeys+".")
		if !ok {
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			a.m.Delete(key)
			return
		}
		var ab Abort
		if json.Unmarshal(e.Value(), &ab) != nil {
			return
		}
		a.store(key, ab)
	})
	return a, err
}

// HookSets returns every tenant's hook set.
func (s *Store) HookSets(ctx context.Context) ([]HookSet, error) {
	keys, err := s.keys(ctx, s.hooks, ">")
	if err != nil {
		return nil, err
	}
	var out []HookSet
	for _, key := range keys {
		tenant, err := subjects.Untoken(key)
		if err != nil {
			continue
		}
		set, ok, err := s.Hooks(ctx, tenant)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, set)
		}
	}
	return out, nil
}
