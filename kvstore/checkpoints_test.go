package kvstore_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
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
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// clock is a time tests move forward.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func openClock(t *testing.T) (*kvstore.Store, jetstream.JetStream, *clock) {
	t.Helper()
	_, js := natstest.JetStream(t)
	c := &clock{t: time.Date(2026, 1, 14, 10, 0, 0, 0, time.UTC)}
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{Clock: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return s, js, c
}

func ecode(err error) string {
	var e *api.Error
	if errors.As(err, &e) {
		return e.ECode
	}
	return fmt.Sprint(err)
}

func save(t *testing.T, s *kvstore.Store, cp api.Checkpoint, state []byte, parent *kvstore.CheckpointParent) api.Checkpoint {
	t.Helper()
	got, err := s.SaveCheckpoint(context.Background(), cp, state, parent)
	if err != nil {
		t.Fatalf("saving %s %d: %v", cp.InvocationID, cp.Seq, err)
	}
	return got
}

// TestCheckpointKindsExpire: a micro checkpoint can be resumed for an
// hour, a macro one for the retention, a named one until it is deleted;
// past its time a checkpoint answers E3707, and one that never was E3702.
// The bucket's own per-key TTLs back the clock up.
func TestCheckpointKindsExpire(t *testing.T) {
	s, js, c := openClock(t)
	ctx := context.Background()
	state := []byte(`{"done":3}`)
	micro := save(t, s, api.Checkpoint{Tenant: "acme", InvocationID: "inv-1", Seq: 1, Kind: api.CheckpointMicro}, state, nil)
	macro := save(t, s, api.Checkpoint{Tenant: "acme", InvocationID: "inv-1", Seq: 2, Kind: api.CheckpointMacro, Name: "parsed"}, state, nil)
	named := save(t, s, api.Checkpoint{Tenant: "acme", InvocationID: "inv-1", Seq: 3, Kind: api.CheckpointNamed, Name: "before-upload"}, state, nil)
	if micro.ID != "cp-1-inv-1" || !micro.ExpiresAt.Equal(c.now().Add(time.Hour)) || !named.ExpiresAt.IsZero() ||
		!macro.ExpiresAt.Equal(c.now().Add(kvstore.DefaultMacroRetention)) {
		t.Fatalf("ids and expiries: %+v %+v %+v", micro, macro, named)
	}
	// The server expires the keys too: micro's bytes carry a TTL, named's none.
	st, err := js.Stream(ctx, subjects.BucketStream(subjects.BucketCheckpoints))
	if err != nil {
		t.Fatal(err)
	}
	ttl := func(key string) string {
		m, err := st.GetLastMsgForSubject(ctx, "$KV."+subjects.BucketCheckpoints+"."+key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Header.Get("Nats-TTL")
	}
	if got := ttl("s.acme.inv-1.1.0"); got == "" {
		t.Fatal("a micro checkpoint's bytes have no TTL")
	}
	if got := ttl("s.acme.inv-1.3.0"); got != "" {
		t.Fatalf("a named checkpoint's bytes have TTL %q", got)
	}
	for _, id := range []string{micro.ID, macro.ID, named.ID} {
		if _, got, err := s.LoadCheckpoint(ctx, "acme", id); err != nil || string(got) != string(state) {
			t.Fatalf("%s: %s %v", id, got, err)
		}
	}
	if _, _, err := s.LoadCheckpoint(ctx, "globex", micro.ID); ecode(err) != api.ECheckpointNotFound {
		t.Fatalf("another tenant's checkpoint: %v", err)
	}
	if _, _, err := s.LoadCheckpoint(ctx, "acme", "cp-9-inv-1"); ecode(err) != api.ECheckpointNotFound {
		t.Fatalf("unknown checkpoint: %v", err)
	}
	c.add(61 * time.Minute)
	if _, _, err := s.LoadCheckpoint(ctx, "acme", micro.ID); ecode(err) != api.ECheckpointExpired {
		t.Fatalf("micro after an hour: %v", err)
	}
	if _, _, err := s.LoadCheckpoint(ctx, "acme", macro.ID); err != nil {
		t.Fatalf("macro after an hour: %v", err)
	}
	latest, ok, maxSeq, err := s.LatestCheckpoint(ctx, "acme", "inv-1")
	if err != nil || !ok || latest.ID != named.ID || maxSeq != 3 {
		t.Fatalf("latest: %+v %v %d %v", latest, ok, maxSeq, err)
	}
	c.add(kvstore.DefaultMacroRetention)
	if _, _, err := s.LoadCheckpoint(ctx, "acme", macro.ID); ecode(err) != api.ECheckpointExpired {
		t.Fatalf("macro after the retention: %v", err)
	}
	if _, got, err := s.LoadCheckpoint(ctx, "acme", named.ID); err != nil || string(got) != string(state) {
		t.Fatalf("named after 91 days: %s %v", got, err)
	}
	list, err := s.ListCheckpoints(ctx, "acme", "")
	if err != nil || len(list) != 3 || !list[0].Expired || !list[1].Expired || list[2].Expired || list[2].Name != "before-upload" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if _, err := s.DeleteCheckpoint(ctx, "acme", named.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.LoadCheckpoint(ctx, "acme", named.ID); ecode(err) != api.ECheckpointNotFound {
		t.Fatalf("deleted: %v", err)
	}
}

// TestCheckpointEncoding: states over 10 KiB are stored zstd-compressed,
// states too large for one value are cut into chunks, and both read back
// exactly; an oversized or non-JSON state is refused with E3701.
func TestCheckpointEncoding(t *testing.T) {
	s, _, _ := openClock(t)
	ctx := context.Background()
	small := save(t, s, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 1, Kind: api.CheckpointNamed}, []byte(`{"a": 1}`), nil)
	if small.Encoding != "json" || small.StateBytes != 7 {
		t.Fatalf("small: %+v", small)
	}
	if _, got, _ := s.LoadCheckpoint(ctx, "t", small.ID); string(got) != `{"a":1}` {
		t.Fatalf("small state comes back as %s", got)
	}
	text := []byte(`{"rows":"` + strings.Repeat("abcdefgh", 64<<10) + `"}`) // 512 KiB, compressible
	z := save(t, s, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 2, Kind: api.CheckpointNamed}, text, nil)
	if z.Encoding != "zstd" || z.StoredBytes >= len(text)/10 || z.Delta {
		t.Fatalf("compressible: %+v", z)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 3<<20)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	noise, _ := json.Marshal(map[string]string{"blob": base64.StdEncoding.EncodeToString(raw)}) // 4 MiB, barely compressible
	big := save(t, s, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 3, Kind: api.CheckpointMicro}, noise, nil)
	if big.Chunks < 6 {
		t.Fatalf("a 4 MiB state in %d chunks", big.Chunks)
	}
	for _, c := range []struct {
		id   string
		want []byte
	}{{z.ID, text}, {big.ID, noise}} {
		if _, got, err := s.LoadCheckpoint(ctx, "t", c.id); err != nil || !bytes.Equal(got, c.want) {
			t.Fatalf("%s: %d bytes back of %d, %v", c.id, len(got), len(c.want), err)
		}
	}
	if _, err := s.SaveCheckpoint(ctx, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 4, Kind: api.CheckpointMicro},
		bytes.Repeat([]byte(" "), 17<<20), nil); ecode(err) != api.ECheckpointCreate {
		t.Fatalf("17 MiB: %v", err)
	}
	if _, err := s.SaveCheckpoint(ctx, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 4, Kind: api.CheckpointMicro},
		[]byte(`{"a":`), nil); ecode(err) != api.ECheckpointCreate {
		t.Fatalf("not JSON: %v", err)
	}
	if _, err := s.SaveCheckpoint(ctx, api.Checkpoint{Tenant: "t", InvocationID: "i", Seq: 3, Kind: api.CheckpointMicro},
		[]byte(`{}`), nil); ecode(err) != api.ECheckpointConflict {
		t.Fatalf("the same checkpoint twice: %v", err)
	}
}

// doc is a JSON object whose members keep their order, as a tool writes
// its state.
type doc struct {
	keys []string
	vals map[string]any
}

func (d *doc) set(k string, v any) {
	if _, ok := d.vals[k]; !ok {
		d.keys = append(d.keys, k)
	}
	d.vals[k] = v
}

func (d *doc) del(k string) {
	delete(d.vals, k)
	for i, x := range d.keys {
		if x == k {
			d.keys = append(d.keys[:i:i], d.keys[i+1:]...)
			return
		}
	}
}

func (d *doc) marshal(indent bool) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range d.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		if indent {
			b.WriteString("\n  ")
		}
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(d.vals[k])
		b.Write(kb)
		b.WriteByte(':')
		if indent {
			b.WriteByte(' ')
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// TestCheckpointDeltaChainsRestoreExactly is the property: whatever a run
// saves, checkpoint after checkpoint (members changed, added, removed,
// set to null, reordered, whitespace or none), restoring any checkpoint of
// the chain gives back exactly the state saved there, compacted; and the
// large states are stored as deltas where that pays.
func TestCheckpointDeltaChainsRestoreExactly(t *testing.T) {
	s, _, c := openClock(t)
	ctx := context.Background()
	deltas := 0
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 99))
		d := &doc{vals: map[string]any{}}
		for i := range 1500 {
			d.set(fmt.Sprintf("k%04d", i), strings.Repeat(string(rune('a'+rng.IntN(26))), 60+rng.IntN(60)))
		}
		inv := fmt.Sprintf("run-%d", seed)
		var parent *kvstore.CheckpointParent
		type saved struct {
			id    string
			state []byte
		}
		var all []saved
		for seq := 1; seq <= 24; seq++ {
			for range 1 + rng.IntN(20) {
				k := d.keys[rng.IntN(len(d.keys))]
				switch rng.IntN(12) {
				case 0:
					d.del(k)
				case 1:
					d.set(fmt.Sprintf("n%d-%d", seq, rng.IntN(1000)), rng.Float64())
				case 2:
					d.set(k, nil)
				case 3:
					d.set(k, []any{1, "two", map[string]any{"three": 3.5}})
				default:
					d.set(k, strings.Repeat("z", rng.IntN(200)))
				}
			}
			if rng.IntN(10) == 0 && len(d.keys) > 2 { // a member moves: no merge patch gives that back
				d.keys[0], d.keys[1] = d.keys[1], d.keys[0]
			}
			state := d.marshal(rng.IntN(6) == 0)
			cp := api.Checkpoint{Tenant: "t", InvocationID: inv, Seq: seq, Kind: api.CheckpointMicro}
			if parent != nil {
				cp.Parent = parent.Meta.ID
			}
			got := save(t, s, cp, state, parent)
			if got.Delta {
				deltas++
				if got.Depth < 1 || got.Depth > 16 || got.StoredBytes >= got.StateBytes/2 {
					t.Fatalf("delta %+v", got)
				}
			}
			compact := new(bytes.Buffer)
			if err := json.Compact(compact, state); err != nil {
				t.Fatal(err)
			}
			parent = &kvstore.CheckpointParent{Meta: got, State: compact.Bytes()}
			all = append(all, saved{got.ID, compact.Bytes()})
			c.add(time.Second)
		}
		for _, sv := range all {
			_, back, err := s.LoadCheckpoint(ctx, "t", sv.id)
			if err != nil || !bytes.Equal(back, sv.state) {
				t.Fatalf("seed %d, %s: %d bytes back, want %d: %v", seed, sv.id, len(back), len(sv.state), err)
			}
		}
		// A checkpoint a later one is a delta of cannot be deleted first.
		list, _ := s.ListCheckpoints(ctx, "t", inv)
		for i := len(list) - 1; i > 0; i-- {
			if list[i].Delta {
				if _, err := s.DeleteCheckpoint(ctx, "t", list[i].Parent); ecode(err) != api.ECheckpointConflict {
					t.Fatalf("deleting %s, the parent of %s: %v", list[i].Parent, list[i].ID, err)
				}
				break
			}
		}
	}
	if deltas < 20 {
		t.Fatalf("only %d of 96 checkpoints were stored as deltas", deltas)
	}
	t.Logf("%d of 96 checkpoints stored as deltas", deltas)
}

// FuzzParseCheckpointID: any id parses or is refused with E3702, and a
// parsed one names itself.
func FuzzParseCheckpointID(f *testing.F) {
	for _, s := range []string{"cp-1-inv", "cp-01-x", "cp--x", "cp-3-", "cp-9-a-b-c", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		inv, seq, err := kvstore.ParseCheckpointID(id)
		if err != nil {
			if ecode(err) != api.ECheckpointNotFound {
				t.Fatalf("%q: %v", id, err)
			}
			return
		}
		if kvstore.CheckpointID(inv, seq) != id {
			t.Fatalf("%q parses as %q %d", id, inv, seq)
		}
	})
}

// TestCheckpointBucketUpgraded: a checkpoints bucket made before
// checkpoints had kinds (one max age for all, no per-key TTLs) is brought
// to per-key TTLs when the store opens, and takes every kind.
func TestCheckpointBucketUpgraded(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: subjects.BucketCheckpoints, History: 1, TTL: 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	s, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, kind := range []string{api.CheckpointMicro, api.CheckpointMacro, api.CheckpointNamed} {
		if _, err := s.SaveCheckpoint(ctx, api.Checkpoint{Tenant: "t", InvocationID: "old", Seq: i + 1, Kind: kind, Name: "n"}, []byte(`{}`), nil); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	st, err := js.Stream(ctx, subjects.BucketStream(subjects.BucketCheckpoints))
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; !c.AllowMsgTTL || c.MaxAge != 0 {
		t.Fatalf("bucket config after the upgrade: ttl %v, max age %v", c.AllowMsgTTL, c.MaxAge)
	}
}
