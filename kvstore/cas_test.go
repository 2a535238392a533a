package kvstore

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/natstest"
)

type counter struct {
	N int `json:"n"`
}

func testBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, js := natstest.JetStream(t)
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: "cas_test"})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func TestUpdate(t *testing.T) {
	kv := testBucket(t)
	ctx := context.Background()
	incr := func(c *counter, _ bool) error { c.N++; return nil }

	t.Run("missing key is created from the zero value", func(t *testing.T) {
		var sawExists bool
		v, rev, err := update(ctx, kv, "created", func(c *counter, exists bool) error {
			sawExists = exists
			c.N = 7
			return nil
		})
		if err != nil || sawExists || v.N != 7 || rev == 0 {
			t.Fatalf("got %+v rev %d exists %v err %v", v, rev, sawExists, err)
		}
		e, err := kv.Get(ctx, "created")
		if err != nil || string(e.Value()) != `{"n":7}` || e.Revision() != rev {
			t.Fatalf("stored %q rev %d, %v", e.Value(), e.Revision(), err)
		}
	})

	t.Run("existing key is decoded and updated", func(t *testing.T) {
		if _, _, err := update(ctx, kv, "existing", incr); err != nil {
			t.Fatal(err)
		}
		v, _, err := update(ctx, kv, "existing", func(c *counter, exists bool) error {
			if !exists || c.N != 1 {
				t.Errorf("fn saw %+v exists %v, want n=1 exists", *c, exists)
			}
			c.N += 10
			return nil
		})
		if err != nil || v.N != 11 {
			t.Fatalf("got %+v %v", v, err)
		}
	})

	t.Run("ErrUnchanged writes nothing", func(t *testing.T) {
		_, rev, _ := update(ctx, kv, "unchanged", incr)
		v, got, err := update(ctx, kv, "unchanged", func(c *counter, _ bool) error { return ErrUnchanged })
		if err != nil || got != rev || v.N != 1 {
			t.Fatalf("got %+v rev %d (want %d) err %v", v, got, rev, err)
		}
		if e, _ := kv.Get(ctx, "unchanged"); e.Revision() != rev {
			t.Fatalf("revision moved from %d to %d", rev, e.Revision())
		}
		if _, rev, err := update(ctx, kv, "never", func(*counter, bool) error { return ErrUnchanged }); err != nil || rev != 0 {
			t.Fatalf("missing key unchanged: rev %d %v", rev, err)
		}
		if _, err := kv.Get(ctx, "never"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("unchanged missing key was created: %v", err)
		}
	})

	t.Run("an error from fn is returned and nothing written", func(t *testing.T) {
		boom := errors.New("boom")
		if _, _, err := update(ctx, kv, "failing", func(*counter, bool) error { return boom }); !errors.Is(err, boom) {
			t.Fatalf("got %v, want boom", err)
		}
		if _, err := kv.Get(ctx, "failing"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("failed update wrote: %v", err)
		}
	})

	t.Run("undecodable value is an error", func(t *testing.T) {
		if _, err := kv.Put(ctx, "garbage", []byte("not json")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := update(ctx, kv, "garbage", incr); err == nil {
			t.Fatal("decoded garbage")
		}
	})

	t.Run("a deleted key is created again", func(t *testing.T) {
		update(ctx, kv, "deleted", incr)
		if err := kv.Delete(ctx, "deleted"); err != nil {
			t.Fatal(err)
		}
		v, _, err := update(ctx, kv, "deleted", incr)
		if err != nil || v.N != 1 {
			t.Fatalf("got %+v %v", v, err)
		}
	})

	t.Run("a write between read and update is retried, not lost", func(t *testing.T) {
		update(ctx, kv, "raced", incr)
		calls := 0
		v, _, err := update(ctx, kv, "raced", func(c *counter, _ bool) error {
			calls++
			if calls == 1 { // another writer gets in first
				if _, err := kv.Put(ctx, "raced", []byte(`{"n":100}`)); err != nil {
					t.Fatal(err)
				}
			}
			c.N++
			return nil
		})
		if err != nil || calls != 2 || v.N != 101 {
			t.Fatalf("got %+v after %d calls, %v; want n=101 after 2", v, calls, err)
		}
	})

	t.Run("endless conflicts end with ErrContention", func(t *testing.T) {
		update(ctx, kv, "contended", incr)
		_, _, err := update(ctx, kv, "contended", func(c *counter, _ bool) error {
			kv.Put(ctx, "contended", []byte(`{"n":0}`))
			return nil
		})
		if !errors.Is(err, ErrContention) {
			t.Fatalf("got %v, want ErrContention", err)
		}
	})

	t.Run("concurrent updaters never lose an increment", func(t *testing.T) {
		const writers, each = 8, 10
		var wg sync.WaitGroup
		for range writers {
			wg.Go(func() {
				for range each {
					for {
						_, _, err := update(ctx, kv, "concurrent", incr)
						if errors.Is(err, ErrContention) {
							continue // lost 32 times in a row: try again
						}
						if err != nil {
							t.Error(err)
						}
						break
					}
				}
			})
		}
		wg.Wait()
		e, err := kv.Get(ctx, "concurrent")
		if err != nil || string(e.Value()) != `{"n":80}` {
			t.Fatalf("stored %q %v, want n=80", e.Value(), err)
		}
	})
}
