package kvstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
)

func open(t *testing.T) (*kvstore.Store, jetstream.JetStream) {
	t.Helper()
	_, js := natstest.JetStream(t)
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, js
}

// TestTerminalStatusIsWrittenOnce races many writers of one invocation: the
// first terminal status wins and is never replaced.
func TestTerminalStatusIsWrittenOnce(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	if _, ok, err := s.SetStatus(ctx, api.Record{InvocationID: "i.1", Tenant: "t", Status: api.StatusRunning}); err != nil || !ok {
		t.Fatalf("running: %v %v", ok, err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	written := map[api.Status]int{}
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := api.StatusSuccess
			if i%2 == 1 {
				st = api.StatusError
			}
			_, ok, err := s.SetStatus(ctx, api.Record{InvocationID: "i.1", Tenant: "t", Status: st, Seq: uint64(i)})
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				written[st]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(written) != 1 {
		t.Fatalf("terminal writes %v: want exactly one", written)
	}
	rec, err := s.Status(ctx, "t", "i.1")
	if err != nil {
		t.Fatal(err)
	}
	for st := range written {
		if rec.Status != st {
			t.Fatalf("stored %s, but %s won", rec.Status, st)
		}
	}
	if _, err := s.Status(ctx, "t", "other"); !errors.Is(err, kvstore.ErrNotFound) {
		t.Fatalf("unknown invocation: %v", err)
	}
	// Ids and tenants with characters KV keys do not allow stay distinct.
	for _, id := range []string{"a.b", "a/b", "a:b", "ü"} {
		if _, _, err := s.SetStatus(ctx, api.Record{InvocationID: id, Tenant: "t", Status: api.StatusSuccess}); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if rec, err := s.Status(ctx, "t", id); err != nil || rec.InvocationID != id {
			t.Fatalf("%q: %+v %v", id, rec, err)
		}
	}
}

func TestToolsRegistryFollowsTheBucket(t *testing.T) {
	s, _ := open(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	doc := func(v string) []byte {
		return []byte(fmt.Sprintf(`{"id":"mcp:fs:read_file","name":"r","version":%q,"description":"d","kind":"mcp","input_schema":{"type":"object"}}`, v))
	}
	if _, err := s.RegisterTool(ctx, doc("1.0.0"), false); err != nil {
		t.Fatal(err)
	}
	reg := tools.NewRegistry()
	if err := s.WatchTools(ctx, reg, nil); err != nil {
		t.Fatal(err)
	}
	// WatchTools returns with everything already stored loaded.
	if _, err := reg.Resolve("mcp:fs:read_file", "1.0.0"); err != nil {
		t.Fatalf("initial load: %v", err)
	}
	if _, err := s.RegisterTool(ctx, doc("1.0.0"), false); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.EDuplicateTool}) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := s.RegisterTool(ctx, doc("1.1.0"), false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { m, err := reg.Resolve("mcp:fs:read_file", ""); return err == nil && m.Version == "1.1.0" })
	if err := s.PurgeTool(ctx, "mcp:fs:read_file", "1.1.0"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { m, err := reg.Resolve("mcp:fs:read_file", ""); return err == nil && m.Version == "1.0.0" })
}

// TestRegisterStampsLifecycleTimes: registration records when a version was
// created and updated; a replacement keeps the creation time.
func TestRegisterStampsLifecycleTimes(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	doc := []byte(`{"id":"stamp","name":"s","version":"1.0.0","description":"d","kind":"mcp","input_schema":{"type":"object","maximum":12345678901234567}}`)
	first, err := s.RegisterTool(ctx, doc, false)
	if err != nil {
		t.Fatal(err)
	}
	c := first.Lifecycle.CreatedAt
	if c.IsZero() || !first.Lifecycle.UpdatedAt.Equal(c) || time.Since(c) > time.Minute {
		t.Fatalf("lifecycle after register = %+v", first.Lifecycle)
	}
	if !strings.Contains(string(first.InputSchema), "12345678901234567") {
		t.Fatalf("stamping changed a number: %s", first.InputSchema)
	}
	time.Sleep(1100 * time.Millisecond) // the stamps have second precision
	again, err := s.RegisterTool(ctx, doc, true)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Lifecycle.CreatedAt.Equal(c) || !again.Lifecycle.UpdatedAt.After(c) {
		t.Fatalf("lifecycle after replace = %+v, created first %v", again.Lifecycle, c)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	natstest.Eventually(t, 5*time.Second, cond)
}

// TestUsageBatchesNeverPassALimit races many reservations of one session
// against a call limit, in two stores (two processes) on one bucket: each
// store batches its concurrent calls into shared compare-and-swaps, and
// exactly the limit is admitted.
func TestUsageBatchesNeverPassALimit(t *testing.T) {
	a, js := open(t)
	b, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const limit, callers = 25, 120
	errFull := errors.New("full")
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for i := range callers {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			id := fmt.Sprintf("i-%d", i)
			u, err := s.UpdateUsage(ctx, "t", "token:root", func(u *kvstore.Usage) error {
				if u.Calls >= limit {
					return errFull
				}
				u.Calls++
				u.Reserved = append(u.Reserved, id)
				return nil
			})
			switch {
			case err == nil:
				if u.Calls > limit || !slices.Contains(u.Reserved, id) {
					t.Errorf("admitted %s, usage %+v", id, u)
				}
				mu.Lock()
				admitted++
				mu.Unlock()
			case !errors.Is(err, errFull):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	u, err := a.Usage(ctx, "t", "token:root")
	if err != nil || u.Calls != limit || admitted != limit || len(u.Reserved) != limit {
		t.Fatalf("admitted %d, stored %+v, %v; want %d", admitted, u, err, limit)
	}
}

// TestClaimRunReturnsTheEarlierRecord: execute's claim reads what an earlier
// delivery left in the same compare-and-swap, and never takes another
// publish's id or a terminal record.
func TestClaimRunReturnsTheEarlierRecord(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	run := api.Record{InvocationID: "i.1", Tenant: "t", Status: api.StatusRunning, Seq: 4}
	prev, ok, rec, written, err := s.ClaimRun(ctx, run, nil)
	if err != nil || ok || !written || rec.Status != api.StatusRunning {
		t.Fatalf("first claim: prev %+v %v, stored %+v %v, %v", prev, ok, rec, written, err)
	}
	if _, err := s.UpdateRecord(ctx, "t", "i.1", func(r *api.Record) { r.Checkpoint = &api.CheckpointRef{Seq: 2} }); err != nil {
		t.Fatal(err)
	}
	prev, ok, rec, written, err = s.ClaimRun(ctx, run, func(p api.Record, n *api.Record) { n.Checkpoint = p.Checkpoint })
	if err != nil || !ok || prev.Status != api.StatusRunning || !written || rec.Checkpoint == nil || rec.Checkpoint.Seq != 2 {
		t.Fatalf("redelivery: prev %+v %v, stored %+v %v, %v", prev, ok, rec, written, err)
	}
	other := run
	other.Seq = 9
	if _, ok, rec, written, err = s.ClaimRun(ctx, other, nil); err != nil || !ok || written || rec.Seq != 4 {
		t.Fatalf("another publish: stored %+v %v, %v", rec, written, err)
	}
	if _, _, err := s.SetStatus(ctx, api.Record{InvocationID: "i.1", Tenant: "t", Status: api.StatusSuccess, Seq: 4}); err != nil {
		t.Fatal(err)
	}
	if _, _, rec, written, err = s.ClaimRun(ctx, run, nil); err != nil || written || rec.Status != api.StatusSuccess {
		t.Fatalf("after the end: stored %+v %v, %v", rec, written, err)
	}
}

// TestOperationsEndWithinTheirBound: a bucket call whose reply never comes
// (here the server is gone and the connection keeps trying to reconnect)
// fails once Options.OpTimeout has passed, even when the caller's context
// allows an hour, as the execute stage's does, so a worker is not held.
func TestOperationsEndWithinTheirBound(t *testing.T) {
	ns := natstest.Server(t)
	nc := natstest.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{OpTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for name, call := range map[string]func() error{
		"read": func() error { _, err := s.Status(ctx, "t", "i-1"); return err },
		"compare-and-swap": func() error {
			_, _, err := s.SetStatus(ctx, api.Record{InvocationID: "i-1", Tenant: "t", Status: api.StatusRunning})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- call() }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("succeeded without a server")
				}
			case <-time.After(time.Minute):
				t.Fatal("still waiting for a reply a minute later")
			}
		})
	}
}

// TestOperationsEndWithTheirCaller: a bucket call whose reply never comes
// ends when its caller's context does, well before Options.OpTimeout,
// and only its caller's: a call under another context started in the
// same instant waits on.
func TestOperationsEndWithTheirCaller(t *testing.T) {
	ns := natstest.Server(t)
	nc := natstest.Connect(t, ns.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{OpTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	base, stop := context.WithTimeout(context.Background(), 2*time.Hour)
	defer stop()
	read := func(ctx context.Context) chan error {
		done := make(chan error, 1)
		go func() { _, err := s.Status(ctx, "t", "i-1"); done <- err }()
		return done
	}
	first, cancelFirst := context.WithCancel(base)
	second, cancelSecond := context.WithCancel(base)
	defer cancelSecond()
	a := read(first)
	time.Sleep(5 * time.Millisecond) // the second starts after the first, in the same slice of time
	b := read(second)
	time.Sleep(20 * time.Millisecond)
	cancelFirst()
	select {
	case err := <-a:
		if err == nil {
			t.Fatal("succeeded without a server")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a call whose caller gave up still waits")
	}
	select {
	case err := <-b:
		t.Fatalf("another caller's call ended with the first's context: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancelSecond()
	if err := <-b; err == nil {
		t.Fatal("succeeded without a server")
	}
}
