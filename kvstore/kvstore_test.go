package kvstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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
	if err := s.DeleteTool(ctx, "mcp:fs:read_file", "1.1.0"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { m, err := reg.Resolve("mcp:fs:read_file", ""); return err == nil && m.Version == "1.0.0" })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	natstest.Eventually(t, 5*time.Second, cond)
}

// TestCheckpointsCompressAndRoundTrip: a large state is stored gzipped and
// read back whole; an oversized one is refused; deletion removes it.
func TestCheckpointsCompressAndRoundTrip(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	state := []byte(`{"rows":"` + strings.Repeat("abcdefgh", 64<<10) + `"}`) // 512 KiB, compressible
	n, err := s.SaveCheckpoint(ctx, "acme", "inv-1", kvstore.Checkpoint{Seq: 3, CreatedAt: time.Now(), State: state})
	if err != nil {
		t.Fatal(err)
	}
	if n >= len(state)/10 {
		t.Fatalf("stored %d bytes for a %d byte state: not compressed", n, len(state))
	}
	cp, ok, err := s.LoadCheckpoint(ctx, "acme", "inv-1")
	if err != nil || !ok || cp.Seq != 3 || !bytes.Equal(cp.State, state) {
		t.Fatalf("round trip: seq %d, %d bytes, %v, %v", cp.Seq, len(cp.State), ok, err)
	}
	small := []byte(`{"next":4}`)
	if _, err := s.SaveCheckpoint(ctx, "acme", "inv-1", kvstore.Checkpoint{Seq: 4, State: small}); err != nil {
		t.Fatal(err)
	}
	if cp, _, _ := s.LoadCheckpoint(ctx, "acme", "inv-1"); cp.Seq != 4 || string(cp.State) != string(small) {
		t.Fatalf("latest checkpoint %d %s", cp.Seq, cp.State)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 2<<20) // does not compress
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	if _, err := s.SaveCheckpoint(ctx, "acme", "inv-2", kvstore.Checkpoint{Seq: 1, State: random}); err == nil {
		t.Fatal("a checkpoint too large to store was accepted")
	}
	if err := s.DeleteCheckpoint(ctx, "acme", "inv-1"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := s.LoadCheckpoint(ctx, "acme", "inv-1"); ok {
		t.Fatal("deleted checkpoint still there")
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
