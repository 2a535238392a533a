package kvstore

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/natstest"
)

// reads counts the reads of a real bucket.
type reads struct {
	jetstream.KeyValue
	n *atomic.Int32
}

func (r reads) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	r.n.Add(1)
	return r.KeyValue.Get(ctx, key)
}

// openCounting opens two Stores on one server, as two processes would,
// each counting the reads of its invocations bucket.
func openCounting(t *testing.T) (a, b *Store, readsA *atomic.Int32) {
	t.Helper()
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	var err error
	if a, err = Open(ctx, js, Options{}); err != nil {
		t.Fatal(err)
	}
	if b, err = Open(ctx, js, Options{}); err != nil {
		t.Fatal(err)
	}
	readsA = new(atomic.Int32)
	r := a.invocations.(remembering)
	r.bounded.KeyValue = reads{r.bounded.KeyValue, readsA}
	a.invocations = r
	return a, b, readsA
}

// An invocation's status written by the stages of one process in turn
// (claimed, running, ended) costs no read: each compare-and-swap starts
// from this process's last write.
func TestStatusWritesOfOneProcessRead(t *testing.T) {
	s, _, n := openCounting(t)
	ctx := context.Background()
	rec, _, err := s.ClaimInvocation(ctx, "t", "i-1", 7, "d", "", "", "")
	if err != nil || rec.Seq != 7 {
		t.Fatalf("claim: %+v %v", rec, err)
	}
	_, existed, stored, written, err := s.ClaimRun(ctx, api.Record{InvocationID: "i-1", Tenant: "t", Status: api.StatusRunning, Seq: 7}, nil)
	if err != nil || !existed || !written || stored.Digest != "d" {
		t.Fatalf("run: existed %v written %v %+v %v", existed, written, stored, err)
	}
	stored, written, err = s.SetStatus(ctx, api.Record{InvocationID: "i-1", Tenant: "t", Status: api.StatusSuccess, Seq: 7})
	if err != nil || !written || stored.Status != api.StatusSuccess || stored.Digest != "d" {
		t.Fatalf("end: written %v %+v %v", written, stored, err)
	}
	if got := n.Load(); got != 0 {
		t.Fatalf("%d reads, want none", got)
	}
	// A status that is already terminal is not replaced, decided on a
	// fresh read.
	if _, written, err := s.SetStatus(ctx, api.Record{InvocationID: "i-1", Tenant: "t", Status: api.StatusError, Seq: 7}); err != nil || written {
		t.Fatalf("terminal replaced: %v %v", written, err)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("%d reads, want one", got)
	}
}

// What another process wrote since is never overwritten: the write at the
// remembered revision is refused, and the change is decided again on what
// is stored.
func TestStatusWrittenElsewhereMeanwhile(t *testing.T) {
	a, b, n := openCounting(t)
	ctx := context.Background()
	if _, _, err := a.ClaimInvocation(ctx, "t", "i-2", 9, "d", "", "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateRecord(ctx, "t", "i-2", func(r *api.Record) { r.CancelRequested = true }); err != nil {
		t.Fatal(err)
	}
	_, _, stored, written, err := a.ClaimRun(ctx, api.Record{InvocationID: "i-2", Tenant: "t", Status: api.StatusRunning, Seq: 9}, nil)
	if err != nil || !written || !stored.CancelRequested {
		t.Fatalf("the cancel written meanwhile was lost: written %v %+v %v", written, stored, err)
	}
	if n.Load() == 0 {
		t.Fatal("no read after the refused write")
	}
	// A claim of an id another process holds is refused on what is stored.
	if _, _, err := b.ClaimInvocation(ctx, "t", "i-3", 1, "d1", "", "", ""); err != nil {
		t.Fatal(err)
	}
	rec, _, err := a.ClaimInvocation(ctx, "t", "i-3", 2, "d2", "", "", "")
	if err != nil || rec.Seq != 1 || rec.Digest != "d1" {
		t.Fatalf("a second claim took the id: %+v %v", rec, err)
	}
}

// countBudgetReads counts the reads of s's budgets bucket from now on.
func countBudgetReads(s *Store) *atomic.Int32 {
	n := new(atomic.Int32)
	r := s.budgets.(remembering)
	r.bounded.KeyValue = reads{r.bounded.KeyValue, n}
	s.budgets = r
	return n
}

// A reservation that follows a read of the usage starts from that read.
func TestUsageReadThenCharged(t *testing.T) {
	s, other, _ := openCounting(t)
	n := countBudgetReads(s)
	ctx := context.Background()
	charge := func(u *Usage) error { u.Calls++; return nil }
	if _, err := other.UpdateUsage(ctx, "t", "s", charge); err != nil {
		t.Fatal(err)
	}
	u, err := s.Usage(ctx, "t", "s")
	if err != nil || u.Calls != 1 {
		t.Fatalf("usage %+v %v", u, err)
	}
	if u, err = s.UpdateUsage(ctx, "t", "s", charge); err != nil || u.Calls != 2 {
		t.Fatalf("charged %+v %v", u, err)
	}
	if got := n.Load(); got != 1 {
		t.Fatalf("%d reads, want the one of Usage", got)
	}
	// Charged elsewhere since: the charge here is not lost.
	if _, err := other.UpdateUsage(ctx, "t", "s", charge); err != nil {
		t.Fatal(err)
	}
	if u, err = s.UpdateUsage(ctx, "t", "s", charge); err != nil || u.Calls != 4 {
		t.Fatalf("charged %+v %v, want 4 calls", u, err)
	}
}

// RecentUsage answers from this process's last write without a read, and
// reads when it holds nothing of the key; what it answers may lag another
// process's write, which the next charge here then does not lose.
func TestRecentUsage(t *testing.T) {
	s, other, _ := openCounting(t)
	n := countBudgetReads(s)
	ctx := context.Background()
	charge := func(u *Usage) error { u.Calls++; return nil }
	if _, err := other.UpdateUsage(ctx, "t", "s", charge); err != nil {
		t.Fatal(err)
	}
	if u, err := s.RecentUsage(ctx, "t", "s"); err != nil || u.Calls != 1 || n.Load() != 1 {
		t.Fatalf("usage %+v %v after %d reads, want 1 call read once", u, err, n.Load())
	}
	if _, err := s.UpdateUsage(ctx, "t", "s", charge); err != nil {
		t.Fatal(err)
	}
	if u, err := s.RecentUsage(ctx, "t", "s"); err != nil || u.Calls != 2 || n.Load() != 1 {
		t.Fatalf("usage %+v %v after %d reads, want 2 calls and no more reads", u, err, n.Load())
	}
	if _, err := other.UpdateUsage(ctx, "t", "s", charge); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.RecentUsage(ctx, "t", "s"); u.Calls != 2 {
		t.Fatalf("usage %+v: want this process's last view, 2 calls", u)
	}
	if u, err := s.UpdateUsage(ctx, "t", "s", charge); err != nil || u.Calls != 4 {
		t.Fatalf("charged %+v %v, want 4 calls", u, err)
	}
}

// The stages of one process each open a store on a connection of their own
// (one bus role each); sharing a Memory, execute's and audit's writes of a
// status validate claimed start from its write, as on one connection,
// without a read. Stores without a shared Memory read.
func TestStatusWritesOfOneProcessShareMemory(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx := context.Background()
	for _, shared := range []bool{true, false} {
		var mem *Memory
		if shared {
			mem = NewMemory()
		}
		stores := make([]*Store, 3) // validate, execute, audit
		n := new(atomic.Int32)
		for i := range stores {
			s, err := Open(ctx, js, Options{Memory: mem})
			if err != nil {
				t.Fatal(err)
			}
			r := s.invocations.(remembering)
			r.bounded.KeyValue = reads{r.bounded.KeyValue, n}
			s.invocations = r
			stores[i] = s
		}
		id := map[bool]string{true: "shared", false: "apart"}[shared]
		if _, _, err := stores[0].ClaimInvocation(ctx, "t", id, 7, "d", "", "", ""); err != nil {
			t.Fatal(err)
		}
		if _, _, _, written, err := stores[1].ClaimRun(ctx, api.Record{InvocationID: id, Tenant: "t", Status: api.StatusRunning, Seq: 7}, nil); err != nil || !written {
			t.Fatalf("run: written %v %v", written, err)
		}
		stored, written, err := stores[2].SetStatus(ctx, api.Record{InvocationID: id, Tenant: "t", Status: api.StatusSuccess, Seq: 7})
		if err != nil || !written || stored.Status != api.StatusSuccess || stored.Digest != "d" {
			t.Fatalf("end: written %v %+v %v", written, stored, err)
		}
		switch got := n.Load(); {
		case shared && got != 0:
			t.Fatalf("stores sharing a memory read %d times, want none", got)
		case !shared && got != 2:
			t.Fatalf("stores apart read %d times, want 2 (execute's and audit's)", got)
		}
	}
}

// The values update writes (encodeValue, a faster encoder) read back, with
// encoding/json as every other reader decodes them and with decodeOwn, as
// encoding/json's own encoding does: the same record and usage, a tool's
// result byte for byte (its receipt covers it).
func TestStoredValuesReadAsEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 29, 6, 40, 1, 123456789, time.UTC)
	rec := api.Record{InvocationID: "inv-1", Tenant: "acme", Status: api.StatusSuccess, Agent: "did:agent:a",
		ToolID: "echo", ToolVersion: "1.0.0", Seq: 1 << 60, Digest: "ab12", UpdatedAt: at, Ending: "PIPELINE:7",
		CancelRequested: true, CancelSig: "sig", CancelBy: "did:agent:b",
		Error: api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "it <broke> & \u2028 stopped"),
		Response: &api.Response{InvocationID: "inv-1", Status: api.StatusSuccess,
			Result: json.RawMessage("{ \"a\" : [1, 2.50, 1e400, \"<b>&\\u00e9\u2028\"],\n\t\"b\": {} }")}}
	usage := Usage{Calls: 3, RuntimeMS: 12, Cost: 0.1 + 0.2, Tokens: 7, UpdatedAt: at, Reserved: []string{"x"}}
	for _, v := range []any{rec, usage} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := encodeValue(v)
		if err != nil {
			t.Fatal(err)
		}
		for name, decode := range map[string]func([]byte, any) error{"encoding/json": json.Unmarshal, "decodeOwn": decodeOwn, "decodeStored": decodeStored} {
			wantV := reflect.New(reflect.TypeOf(v))
			gotV := reflect.New(reflect.TypeOf(v))
			if err := json.Unmarshal(want, wantV.Interface()); err != nil {
				t.Fatal(err)
			}
			if err := decode(got, gotV.Interface()); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !reflect.DeepEqual(wantV.Interface(), gotV.Interface()) {
				t.Errorf("%s reads %s\nas      %+v\nnot, as %+v", name, got, gotV.Elem(), wantV.Elem())
			}
		}
	}
}

// A value in the bucket that is not valid JSON is refused as encoding/json
// refuses it, whoever wrote it.
func TestStoredValueInvalidRefused(t *testing.T) {
	for _, b := range []string{`{"status":"running",}`, `{"response":{"result":[1,}}`, `{"ingest_seq":1} {}`, "{\"agent_did\":\"\x01\"}"} {
		var want, got api.Record
		werr := json.Unmarshal([]byte(b), &want)
		gerr := decodeStored([]byte(b), &got)
		if werr == nil || gerr == nil {
			t.Errorf("%q: read with %v (encoding/json: %v), want refused", b, gerr, werr)
		}
	}
}

// A status read back decodes what the bucket holds: this process's own
// write as encoding/json would read it, another process's write since
// as it is.
func TestStatusReadBack(t *testing.T) {
	a, b, _ := openCounting(t)
	ctx := context.Background()
	if _, _, err := a.ClaimInvocation(ctx, "t", "i-4", 3, "d", "did:agent:a", "echo", "1.0.0"); err != nil {
		t.Fatal(err)
	}
	got, err := a.Status(ctx, "t", "i-4")
	if err != nil {
		t.Fatal(err)
	}
	e, err := a.invocations.Get(ctx, invocationKey("t", "i-4"))
	if err != nil {
		t.Fatal(err)
	}
	var want api.Record
	if err := json.Unmarshal(e.Value(), &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || got.Agent != "did:agent:a" || got.Seq != 3 {
		t.Fatalf("read back %+v, stored %+v", got, want)
	}
	if _, err := b.UpdateRecord(ctx, "t", "i-4", func(r *api.Record) { r.CancelRequested = true }); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Status(ctx, "t", "i-4"); err != nil || !got.CancelRequested {
		t.Fatalf("another process's write not read: %+v %v", got, err)
	}
}

// A status this process wrote is read back as the bucket holds it, also
// where the remembered record is not what its encoding reads back as
// (text that is not UTF-8, a time in another zone), and is read again
// from its bytes, not from memory, once a field is not flat.
func TestStatusRememberedReadsAsStored(t *testing.T) {
	a, _, _ := openCounting(t)
	ctx := context.Background()
	paris := time.FixedZone("CET", 3600)
	for i, rec := range []api.Record{
		{Status: api.StatusRunning, Agent: "did:agent:a", ToolID: "echo", Seq: 1},
		{Status: api.StatusRunning, Agent: "did:agent:\xff", ToolID: "echo\xfe", Seq: 1},
		{Status: api.StatusRunning, Agent: "did:agent:a", Seq: 1, UpdatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, paris)},
		{Status: api.StatusRunning, Agent: "did:agent:a", Seq: 1, Checkpoint: &api.CheckpointRef{ID: "cp-1"}},
	} {
		rec.Tenant, rec.InvocationID = "t", "i-"+string(rune('a'+i))
		if _, _, err := a.SetStatus(ctx, rec); err != nil {
			t.Fatal(err)
		}
		got, err := a.Status(ctx, "t", rec.InvocationID)
		if err != nil {
			t.Fatal(err)
		}
		e, err := a.invocations.Get(ctx, invocationKey("t", rec.InvocationID))
		if err != nil {
			t.Fatal(err)
		}
		var want api.Record
		if err := json.Unmarshal(e.Value(), &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("record %d read back as\n%+v\nstored as\n%+v", i, got, want)
		}
		// The next compare-and-swap starts from the same record.
		next, _, err := a.SetStatus(ctx, api.Record{Tenant: "t", InvocationID: rec.InvocationID, Status: api.StatusSuccess, Seq: 1})
		if err != nil || next.Agent != want.Agent {
			t.Errorf("record %d: ended with agent %q, stored %q (%v)", i, next.Agent, want.Agent, err)
		}
	}
}

// TestFlatRecordKnowsEveryField fails when api.Record gains a field that
// flatRecord would copy unchecked: a pointer, slice or map it would share,
// or a string it does not hold to valid UTF-8 (encoding/json reads such a
// string back changed, so the remembered record would differ from the
// stored one).
func TestFlatRecordKnowsEveryField(t *testing.T) {
	rt := reflect.TypeOf(api.Record{})
	for i := range rt.NumField() {
		f := rt.Field(i)
		var rec api.Record
		rec.UpdatedAt = time.Now().UTC()
		fv := reflect.ValueOf(&rec).Elem().Field(i)
		switch f.Type.Kind() {
		case reflect.String:
			fv.SetString("\xff")
		case reflect.Pointer:
			fv.Set(reflect.New(f.Type.Elem()))
		case reflect.Slice:
			fv.Set(reflect.MakeSlice(f.Type, 1, 1))
		case reflect.Map:
			fv.Set(reflect.MakeMap(f.Type))
		case reflect.Bool, reflect.Int, reflect.Int64, reflect.Uint64, reflect.Float64:
			continue // copied whole, read back as written
		case reflect.Struct:
			if f.Type == reflect.TypeOf(time.Time{}) {
				continue // the zone is checked apart
			}
			t.Fatalf("field %s: a struct flatRecord does not know", f.Name)
		default:
			t.Fatalf("field %s: kind %s flatRecord does not know", f.Name, f.Type.Kind())
		}
		if _, ok := flatRecord(&rec); ok {
			t.Errorf("field %s (%s) set to what would not read back as stored, yet the record is remembered decoded", f.Name, f.Type)
		}
	}
}

// A route worker's next lease of a rate-limit bucket starts from its last
// write, without a read; a lease another process took meanwhile is not
// lost, and what the bucket remembers is the caller's to change.
func TestBucketWritesOfOneProcessRead(t *testing.T) {
	a, b, _ := openCounting(t)
	n := new(atomic.Int32)
	r := a.ratelimits.(remembering)
	r.bounded.KeyValue = reads{r.bounded.KeyValue, n}
	a.ratelimits = r
	ctx := context.Background()
	take := func(s *Store, id string) Bucket {
		t.Helper()
		got, err := s.UpdateBucket(ctx, "t", "echo", func(bk *Bucket, exists bool) error {
			if !exists {
				bk.Tokens = 10
			}
			bk.Tokens--
			bk.Take(id)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	take(a, "i-1")
	take(a, "i-2")
	if got := n.Load(); got != 1 {
		t.Fatalf("%d reads for two writes of one process, want one (the first)", got)
	}
	take(b, "i-3")
	got := take(a, "i-4")
	if got.Tokens != 6 || !got.HasTaken("i-3") || !got.HasTaken("i-1") {
		t.Fatalf("after four takes, two by another process between: %+v", got)
	}
	if n.Load() != 2 {
		t.Fatalf("%d reads, want one more after the other process's write", n.Load())
	}
	// Changing what a write returned changes nothing remembered.
	got.Took[0] = "x"
	if got := take(a, "i-5"); !got.HasTaken("i-1") || got.Tokens != 5 {
		t.Fatalf("the remembered bucket was changed by its caller: %+v", got)
	}
	if stored, err := b.RateBucket(ctx, "t", "echo"); err != nil || !stored.HasTaken("i-5") || stored.Tokens != 5 {
		t.Fatalf("stored %+v, %v", stored, err)
	}
}

// TestRecentWritesKeepTheLatest: past maxRecent keys, each new key takes
// the place of the one first remembered longest ago, or a forgotten key's
// place; a key written again keeps its place, with the new write.
func TestRecentWritesKeepTheLatest(t *testing.T) {
	var r recentWrites
	key := func(i int) string { return "k" + strconv.Itoa(i) }
	for i := range maxRecent {
		r.put(key(i), uint64(i+1), []byte(key(i)), nil)
	}
	r.put(key(5), 100, []byte("again"), nil) // in its place: no key goes
	r.forget(key(1))
	for i := maxRecent; i < maxRecent+3; i++ {
		r.put(key(i), uint64(i+1), []byte(key(i)), nil)
	}
	for _, i := range []int{0, 1, 2} {
		if _, ok := r.get(key(i)); ok {
			t.Errorf("key %d is still remembered", i)
		}
	}
	if w, ok := r.get(key(5)); !ok || w.rev != 100 || string(w.val) != "again" {
		t.Errorf("key written again: %+v %v", w, ok)
	}
	for _, i := range []int{3, 4, 6, maxRecent - 1, maxRecent, maxRecent + 1, maxRecent + 2} {
		if w, ok := r.get(key(i)); !ok || w.rev != uint64(i+1) || string(w.val) != key(i) {
			t.Errorf("key %d: %+v %v", i, w, ok)
		}
	}
	if len(r.m) != maxRecent || len(r.ring) != maxRecent {
		t.Errorf("%d keys in a ring of %d, want %d in %d", len(r.m), len(r.ring), maxRecent, maxRecent)
	}
	for k, i := range r.m {
		if r.ring[i].key != k {
			t.Fatalf("key %s indexes the slot of %s", k, r.ring[i].key)
		}
	}
}
