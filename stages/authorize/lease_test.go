package authorize

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/stages/execute/kinds"
)

// leaseRig is authorize over a real usage bucket, with as many workers
// (authorizers, each with its own store and connection, as processes have)
// as asked.
type leaseRig struct {
	t       *testing.T
	key     *token.SigningKey
	stores  []*countingStore
	workers []*Authorizer
	seq     atomic.Int64
}

// countingStore counts the usage writes a worker asks for.
type countingStore struct {
	*kvstore.Store
	updates atomic.Int64
}

func (c *countingStore) UpdateUsage(ctx context.Context, tenant, session string, change func(*kvstore.Usage) error) (kvstore.Usage, error) {
	c.updates.Add(1)
	return c.Store.UpdateUsage(ctx, tenant, session, change)
}

func newLeaseRig(t *testing.T, workers int) *leaseRig {
	t.Helper()
	ctx := context.Background()
	key, engine, reg := echoSetup(t)
	r := &leaseRig{t: t, key: key}
	srv := natstest.Server(t)
	for range workers {
		js, err := jetstream.New(natstest.Connect(t, srv.ClientURL()))
		if err != nil {
			t.Fatal(err)
		}
		s, err := kvstore.Open(ctx, js, kvstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cs := &countingStore{Store: s}
		r.stores = append(r.stores, cs)
		r.workers = append(r.workers, New(Config{Registry: reg, Kinds: kinds.Compiled(), Policy: engine, Store: cs,
			Verifier: &token.Verifier{Keys: token.StaticKeys{Set: key.KeySet()}, Issuer: issuer, Audience: audience}}))
	}
	return r
}

func (r *leaseRig) mint(id string, b token.Budget) string {
	bp := &b
	if b == (token.Budget{}) {
		bp = nil
	}
	raw, err := token.Mint(r.key, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "acme", AgentDID: "did:agent:a",
		Budget: bp,
		RegisteredClaims: jwt.RegisteredClaims{ID: id, Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		r.t.Fatal(err)
	}
	return raw
}

// call asks worker w to authorize one new call under raw.
func (r *leaseRig) call(w int, raw string) error {
	inv := &envelope.Invocation{ID: fmt.Sprintf("i-%d", r.seq.Add(1)), Tenant: "acme", Status: api.StatusPending,
		Request: &api.Request{ToolID: "echo", CapabilityToken: raw,
			AgentContext: api.AgentContext{AgentDID: "did:agent:a", TenantID: "acme"}}}
	_, err := r.workers[w].Process(context.Background(), inv)
	if err == nil && (inv.Authz == nil || !inv.Authz.Reserved) {
		return errors.New("admitted without a reservation")
	}
	return err
}

func (r *leaseRig) usage(id string) kvstore.Usage {
	u, err := r.stores[0].Usage(context.Background(), "acme", token.BudgetKey(id))
	if err != nil {
		r.t.Fatal(err)
	}
	return u
}

func exhaustedErr(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.ECode == api.EBudgetExhausted
}

// TestLeasesNeverPassMaxCalls: three workers, eight callers each, call
// under one max_calls budget until refused. Leases or not, exactly the cap
// is admitted; a worker that finds the cap reached only in others' leases
// retries (transient) rather than refusing, and the leases all end.
func TestLeasesNeverPassMaxCalls(t *testing.T) {
	r := newLeaseRig(t, 3)
	const cap = 200
	raw := r.mint("tok-cap", token.Budget{MaxCalls: cap})
	var admitted, waited atomic.Int64
	var wg sync.WaitGroup
	for w := range r.workers {
		for range 8 {
			wg.Go(func() {
				for {
					err := r.call(w, raw)
					if _, transient := stages.IsTransient(err); transient {
						waited.Add(1)
						time.Sleep(10 * time.Millisecond)
						continue
					}
					switch {
					case err == nil:
						admitted.Add(1)
						continue
					case !exhaustedErr(err):
						t.Error(err)
					}
					return
				}
			})
		}
	}
	wg.Wait()
	if got := admitted.Load(); got != cap {
		t.Fatalf("%d calls admitted under max_calls %d", got, cap)
	}
	u := r.usage("tok-cap")
	if u.Calls != cap || len(u.Leases) != 0 || u.Made() != cap {
		t.Fatalf("usage after the cap: %d calls, leases %+v", u.Calls, u.Leases)
	}
	var writes int64
	for _, s := range r.stores {
		writes += s.updates.Load()
	}
	t.Logf("%d calls, %d usage writes, %d transient waits", cap, writes, waited.Load())
}

// TestLeaseSavesWrites: one worker's sequential calls under a large budget
// write the usage once a lease, the leases growing from one call to
// maxLease, not once a call; a budget called rarely leases nothing.
func TestLeaseSavesWrites(t *testing.T) {
	r := newLeaseRig(t, 1)
	r.workers[0].leases.ttl = time.Minute // outlasts the calls on any machine
	raw := r.mint("tok-big", token.Budget{MaxCalls: 1 << 40})
	const calls = 64
	for range calls {
		if err := r.call(0, raw); err != nil {
			t.Fatal(err)
		}
	}
	// 1, 2, 4, 8, 16, 16, 16 calls a write, then the 64th.
	if n := r.stores[0].updates.Load(); n != 8 {
		t.Fatalf("%d usage writes for %d calls, want 8", n, calls)
	}
	// The record counts the lease's calls given since its write as leased:
	// only the worker knows it gave them.
	u := r.usage("tok-big")
	if got := u.Made() + r.workers[0].leases.given("acme", token.BudgetKey("tok-big")); got != calls {
		t.Fatalf("%d calls made as the worker sees them, want %d", got, calls)
	}
	if err := r.workers[0].Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if u := r.usage("tok-big"); u.Calls != calls || u.Made() != calls || len(u.Leases) != 0 {
		t.Fatalf("after release: %d calls, %d made, leases %+v; want %d", u.Calls, u.Made(), u.Leases, calls)
	}

	// Calls further apart than two lease lifetimes reserve one at a time.
	r.workers[0].leases.ttl = time.Millisecond
	rare := r.mint("tok-rare", token.Budget{MaxCalls: 1 << 40})
	for range 3 {
		time.Sleep(5 * time.Millisecond)
		if err := r.call(0, rare); err != nil {
			t.Fatal(err)
		}
		if u := r.usage("tok-rare"); len(u.Leases) != 0 {
			t.Fatalf("a rarely called budget leased %+v", u.Leases)
		}
	}
}

// TestUnusedLeaseComesBack: a worker that makes one call and stops keeps
// the rest of its lease from the others only until the lease expires.
// Meanwhile another worker that reaches the cap counting that lease is
// told to retry (transient), not refused; afterwards it makes every call
// left.
func TestUnusedLeaseComesBack(t *testing.T) {
	r := newLeaseRig(t, 2)
	r.workers[0].leases.ttl = time.Second
	const cap = 64
	raw := r.mint("tok-back", token.Budget{MaxCalls: cap})
	// Four calls in a row: a write of one, a write of two (the third call
	// given from it), a write of four, of which three are left.
	for range 4 {
		if err := r.call(0, raw); err != nil {
			t.Fatal(err)
		}
	}
	const unused = 3
	u := r.usage("tok-back")
	if u.Leased() != unused || u.Calls != 7 {
		t.Fatalf("after four calls: %d reserved, %d leased; want 7 and %d", u.Calls, u.Leased(), unused)
	}
	made := 4
	callAll := func() error {
		for {
			err := r.call(1, raw)
			if err != nil {
				return err
			}
			made++
		}
	}
	if _, transient := stages.IsTransient(callAll()); !transient {
		t.Fatal("the cap reached counting another worker's lease refused the call; want a retry")
	}
	if made != cap-unused {
		t.Fatalf("%d calls made before the retry, want %d", made, cap-unused)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return len(r.usage("tok-back").Leases) == 0 }, "the lease to come back")
	if err := callAll(); !exhaustedErr(err) {
		t.Fatalf("after the lease came back: %v, want the budget exhausted", err)
	}
	if made != cap {
		t.Fatalf("%d calls made of %d", made, cap)
	}
}

// TestStaleLeaseIsDropped: a lease whose holder died is dropped by the
// next writer once stale, its calls counted as made: the budget ends
// short, never over.
func TestStaleLeaseIsDropped(t *testing.T) {
	r := newLeaseRig(t, 1)
	const cap = 40
	raw := r.mint("tok-stale", token.Budget{MaxCalls: cap})
	ctx := context.Background()
	// A dead worker's lease: 30 calls reserved, ended long ago.
	_, err := r.stores[0].Store.UpdateUsage(ctx, "acme", token.BudgetKey("tok-stale"), func(u *kvstore.Usage) error {
		u.Calls = 35
		u.Leases = []kvstore.Lease{{Holder: "dead", Calls: 30, Until: time.Now().Add(-time.Minute)}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for {
		err := r.call(0, raw)
		if err != nil {
			if !exhaustedErr(err) {
				t.Fatal(err)
			}
			break
		}
		made++
	}
	if made != cap-35 {
		t.Fatalf("%d calls made after the stale lease, want %d", made, cap-35)
	}
	if u := r.usage("tok-stale"); u.Calls != cap || slices.ContainsFunc(u.Leases, func(l kvstore.Lease) bool { return l.Holder == "dead" }) {
		t.Fatalf("usage %+v", u)
	}
}

// TestDeadLeaseWait: at the cap through a lease whose holder died, a call
// is told to retry once the lease is stale, not sooner (a stage retries a
// message a few times only); that one retry gets the cap's answer.
func TestDeadLeaseWait(t *testing.T) {
	r := newLeaseRig(t, 1)
	const cap = 40
	raw := r.mint("tok-dead", token.Budget{MaxCalls: cap})
	ended := time.Now().Add(-time.Second)
	_, err := r.stores[0].Store.UpdateUsage(context.Background(), "acme", token.BudgetKey("tok-dead"), func(u *kvstore.Usage) error {
		u.Calls = cap
		u.Leases = []kvstore.Lease{{Holder: "dead", Calls: 5, Until: ended}}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = r.call(0, raw)
	wait, transient := stages.IsTransient(err)
	if stale := time.Until(ended.Add(leaseGrace)); !transient || wait < stale || wait > stale+time.Second {
		t.Fatalf("at the cap through a dead lease: %v, retry in %v; want a retry once it is stale (in %v)", err, wait, stale)
	}
	time.Sleep(wait)
	if err := r.call(0, raw); !exhaustedErr(err) {
		t.Fatalf("after the wait: %v, want the budget exhausted", err)
	}
	if u := r.usage("tok-dead"); len(u.Leases) != 0 || u.Made() != cap {
		t.Fatalf("usage %+v", u)
	}
}

func TestLeaseWait(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name   string
		leases []kvstore.Lease
		want   time.Duration
	}{
		{"a live lease ends", []kvstore.Lease{{Until: now.Add(80 * time.Millisecond)}}, 130 * time.Millisecond},
		{"the first of two", []kvstore.Lease{{Until: now.Add(time.Second)}, {Until: now.Add(10 * time.Millisecond)}}, 60 * time.Millisecond},
		{"one past its end goes stale", []kvstore.Lease{{Until: now.Add(-500 * time.Millisecond)}}, leaseGrace - 450*time.Millisecond},
	} {
		if got := leaseWait(c.leases, now); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
