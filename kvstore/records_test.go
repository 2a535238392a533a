package kvstore_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
)

// A checkpoint resumes only as the signer stored it, under its own key.
func TestCheckpointSignedAndBound(t *testing.T) {
	ctx := context.Background()
	s, js, _ := openClock(t)
	pub, key, _ := ed25519.GenerateKey(nil)
	s.SignCheckpoints(func(b []byte) string { return base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, b)) },
		func(b []byte, sig string) bool {
			raw, err := base64.RawURLEncoding.DecodeString(sig)
			return err == nil && ed25519.Verify(pub, b, raw)
		})
	kv, err := js.KeyValue(ctx, kvstore.BucketCheckpoints)
	if err != nil {
		t.Fatal(err)
	}
	cp := save(t, s, api.Checkpoint{Kind: api.CheckpointNamed, Name: "n", Tenant: "acme", InvocationID: "inv-a", ToolID: "t", Seq: 1},
		[]byte(`{"step":1}`), nil)
	if _, state, err := s.LoadCheckpoint(ctx, "acme", cp.ID); err != nil || string(state) != `{"step":1}` {
		t.Fatalf("a signed checkpoint loads %s, %v", state, err)
	}
	put := func(key string, v any) {
		t.Helper()
		b, ok := v.([]byte)
		if !ok {
			b, _ = json.Marshal(v)
		}
		if _, err := kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	refused := func(id string) {
		t.Helper()
		if _, _, err := s.LoadCheckpoint(ctx, "acme", id); ecode(err) != api.ECheckpointUnsigned {
			t.Fatalf("loading %s: %v, want E3236", id, err)
		}
	}
	t.Run("description altered", func(t *testing.T) {
		put("m.acme.inv-a.1", func() api.Checkpoint { c := cp; c.Name = "other"; return c }())
		refused(cp.ID)
		put("m.acme.inv-a.1", cp)
	})
	t.Run("bytes replaced", func(t *testing.T) {
		put("s.acme.inv-a.1.0", []byte(`{"step":9}`))
		refused(cp.ID)
	})
	t.Run("moved under another call", func(t *testing.T) {
		c := cp
		c.ID, c.InvocationID = kvstore.CheckpointID("inv-b", 1), "inv-b"
		put("m.acme.inv-b.1", c)
		refused(c.ID)
		put("m.acme.inv-b.2", cp) // signed, but for inv-a number 1
		if _, _, err := s.LoadCheckpoint(ctx, "acme", kvstore.CheckpointID("inv-b", 2)); err == nil {
			t.Fatal("a checkpoint read under another key loaded")
		}
	})
	t.Run("unsigned", func(t *testing.T) {
		c := cp
		c.Sig = ""
		put("m.acme.inv-a.1", c)
		refused(cp.ID)
	})
}

// Erasing a counter never refills it: the bucket refuses a purge, and a
// deleted counter reads as empty from the time of the delete.
func TestErasedCounterIsEmpty(t *testing.T) {
	ctx := context.Background()
	s, js, _ := openClock(t)
	var erased []string
	s.OnCounterErased(func(_ context.Context, tenant, tool string) { erased = append(erased, tenant+"/"+tool) })
	kv, err := js.KeyValue(ctx, kvstore.BucketRateLimits)
	if err != nil {
		t.Fatal(err)
	}
	spend := func(b *kvstore.Bucket, exists bool) error {
		if !exists {
			*b = kvstore.Bucket{Tokens: 1, At: time.Now()}
		}
		b.Tokens--
		return nil
	}
	if _, err := s.UpdateBucket(ctx, "acme", "t", spend); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "acme.t"); err == nil {
		t.Fatal("the rate-limit bucket allowed a purge")
	}
	if err := kv.Delete(ctx, "acme.t"); err != nil {
		t.Fatal(err)
	}
	var seen kvstore.Bucket
	var existed bool
	_, err = s.UpdateBucket(ctx, "acme", "t", func(b *kvstore.Bucket, exists bool) error {
		seen, existed = *b, exists
		return kvstore.ErrUnchanged
	})
	if err != nil {
		t.Fatal(err)
	}
	if !existed || seen.Tokens != 0 || time.Since(seen.At) > time.Minute {
		t.Fatalf("a deleted counter reads as %+v (exists %v), want empty as of its delete", seen, existed)
	}
	if len(erased) != 1 || erased[0] != "acme/t" {
		t.Fatalf("erased counters reported: %v", erased)
	}
	// A counter never written is still a full one.
	_, err = s.UpdateBucket(ctx, "acme", "new", func(_ *kvstore.Bucket, exists bool) error {
		existed = exists
		return kvstore.ErrUnchanged
	})
	if err != nil || existed {
		t.Fatalf("a new counter: exists %v, %v", existed, err)
	}
}
