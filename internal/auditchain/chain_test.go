package auditchain_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// trail is a bus with toolgate's topology, whose AUDIT and AUDIT_CHAIN
// allow deletes and purges: what someone holding the server's store can
// do anyway, here done through the API.
type trail struct {
	t   *testing.T
	js  jetstream.JetStream
	key ed25519.PrivateKey
	ctx context.Context
}

func newTrail(t *testing.T) *trail {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := &trail{t: t, js: js, ctx: ctx}
	tr.loosen(subjects.StreamAudit)
	tr.loosen(subjects.StreamAuditChain)
	_, tr.key, _ = ed25519.GenerateKey(rand.Reader)
	return tr
}

// loosen makes stream again without its deny flags.
func (tr *trail) loosen(name string) {
	for _, c := range topology.Streams(topology.TopologyOptions{}) {
		if c.Name != name {
			continue
		}
		if err := tr.js.DeleteStream(tr.ctx, name); err != nil {
			tr.t.Fatal(err)
		}
		c.DenyDelete, c.DenyPurge = false, false
		if _, err := tr.js.CreateStream(tr.ctx, c); err != nil {
			tr.t.Fatal(err)
		}
	}
}

func event(tenant string, i int) (string, []byte) {
	return subjects.AuditEvent(tenant, "tool.succeeded"),
		fmt.Appendf(nil, `{"specversion":"1.0","id":"%s-%d","type":"ai.agent.tool.succeeded","data":{"n":%d}}`, tenant, i, i)
}

func (tr *trail) publish(subject string, data []byte) uint64 {
	tr.t.Helper()
	a, err := tr.js.Publish(tr.ctx, subject, data)
	if err != nil {
		tr.t.Fatal(err)
	}
	return a.Sequence
}

// fill publishes n events round-robin over three tenants.
func (tr *trail) fill(from, n int) {
	tenants := []string{"acme", "globex", "initech"}
	for i := from; i < from+n; i++ {
		tr.publish(event(tenants[i%3], i))
	}
}

func (tr *trail) checkpointer(every int) *auditchain.Checkpointer {
	return &auditchain.Checkpointer{JS: tr.js, Key: tr.key, Every: every, Interval: time.Hour, Writer: "test"}
}

// checkpoint writes every checkpoint due (Every events each).
func (tr *trail) checkpoint(every int) {
	tr.t.Helper()
	c := tr.checkpointer(every)
	for {
		more, err := c.Step(tr.ctx)
		if err != nil {
			tr.t.Fatal(err)
		}
		if !more {
			return
		}
	}
}

// flush covers every event, however few wait.
func (tr *trail) flush() {
	tr.t.Helper()
	c := tr.checkpointer(10)
	c.Interval = time.Nanosecond
	for range 100 {
		if more, err := c.Step(tr.ctx); err != nil {
			tr.t.Fatal(err)
		} else if !more {
			break
		}
	}
}

func (tr *trail) verify(o auditchain.Options) *auditchain.Report {
	tr.t.Helper()
	if o.Key == nil {
		o.Key = tr.key.Public().(ed25519.PublicKey)
	}
	r, err := auditchain.Verify(tr.ctx, auditchain.Bus{JS: tr.js}, o)
	if err != nil {
		tr.t.Fatal(err)
	}
	return r
}

func (tr *trail) export(o auditchain.ExportOptions) []byte {
	tr.t.Helper()
	var b bytes.Buffer
	if _, err := auditchain.Export(tr.ctx, auditchain.Bus{JS: tr.js}, &b, o); err != nil {
		tr.t.Fatal(err)
	}
	return b.Bytes()
}

func verifyFile(t *testing.T, b []byte, pub ed25519.PublicKey) *auditchain.Report {
	t.Helper()
	f, err := auditchain.ReadFile(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	r, err := auditchain.Verify(context.Background(), f, auditchain.Options{Key: pub})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// found is a finding's kind, sequence and event id, as tests name them.
func found(r *auditchain.Report) []string {
	var out []string
	for _, f := range r.Findings {
		out = append(out, fmt.Sprintf("%s %d %s", f.Kind, f.Seq, f.EventID))
	}
	return out
}

func wantFindings(t *testing.T, r *auditchain.Report, want ...string) {
	t.Helper()
	got := found(r)
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("missing finding %q; found %q", w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("found %d findings %q, want %q", len(got), got, want)
	}
}

// TestVerifyIntact: a chain over 30 events in three checkpoints verifies,
// and the five events after it are named as the unchecked tail, on the bus
// and in an export.
func TestVerifyIntact(t *testing.T) {
	tr := newTrail(t)
	tr.fill(0, 30)
	tr.checkpoint(10)
	tr.fill(30, 5)
	r := tr.verify(auditchain.Options{})
	if !r.Intact() || r.Checkpoints != 3 || r.Events != 30 {
		t.Fatalf("report %+v, want intact with 3 checkpoints over 30 events", r)
	}
	if len(r.Notes) != 1 || r.Notes[0].Kind != auditchain.KindTail || r.Notes[0].Seq != 31 || r.Notes[0].Last != 35 {
		t.Fatalf("notes %v, want the unchecked tail 31..35", r.Notes)
	}
	pub := tr.key.Public().(ed25519.PublicKey)
	if r := verifyFile(t, tr.export(auditchain.ExportOptions{}), pub); !r.Intact() || r.Events != 30 {
		t.Fatalf("export: %+v", r)
	}
	// One tenant's export holds only its events, each proven by its path.
	acme := tr.export(auditchain.ExportOptions{Tenant: "acme"})
	if n := bytes.Count(acme, []byte(`"kind":"event"`)); n != 12 {
		t.Fatalf("acme's export holds %d events, want 12", n)
	}
	if r := verifyFile(t, acme, pub); !r.Intact() {
		t.Fatalf("acme's export: %v", found(r))
	}
	// The tail is covered once a checkpoint is due.
	tr.flush()
	if r := tr.verify(auditchain.Options{}); !r.Intact() || r.Checkpoints != 4 || len(r.Notes) != 0 {
		t.Fatalf("after flush: %+v", r)
	}
}

// TestVerifyTampering: each way of changing the trail, done with the
// stream's own operations, is found and named by sequence and event id.
func TestVerifyTampering(t *testing.T) {
	id := func(seq int) string {
		return []string{"acme", "globex", "initech"}[(seq-1)%3] + fmt.Sprintf("-%d", seq-1)
	}
	t.Run("message deleted", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 30)
		tr.checkpoint(10)
		audit, _ := tr.js.Stream(tr.ctx, subjects.StreamAudit)
		if err := audit.DeleteMsg(tr.ctx, 15); err != nil {
			t.Fatal(err)
		}
		r := tr.verify(auditchain.Options{})
		wantFindings(t, r, "deleted 15 "+id(15))
		// A tenant's verify names only its own events.
		if r := tr.verify(auditchain.Options{Tenant: "acme"}); !r.Intact() {
			t.Errorf("acme's verify: %v", found(r))
		}
		if r := tr.verify(auditchain.Options{Tenant: "initech"}); len(r.Findings) != 1 {
			t.Errorf("initech's verify: %v", found(r))
		}
	})
	t.Run("message deleted before its checkpoint", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 10)
		audit, _ := tr.js.Stream(tr.ctx, subjects.StreamAudit)
		if err := audit.DeleteMsg(tr.ctx, 4); err != nil {
			t.Fatal(err)
		}
		tr.checkpoint(10)
		r := tr.verify(auditchain.Options{})
		wantFindings(t, r, "deleted 4 ")
		if r.Findings[0].Detail != "deleted before it was checkpointed" {
			t.Errorf("finding %v", r.Findings[0])
		}
	})
	t.Run("tenant purged", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 12)
		tr.checkpoint(6)
		audit, _ := tr.js.Stream(tr.ctx, subjects.StreamAudit)
		if err := audit.Purge(tr.ctx, jetstream.WithPurgeSubject(subjects.AuditTenant("globex"))); err != nil {
			t.Fatal(err)
		}
		r := tr.verify(auditchain.Options{})
		wantFindings(t, r, "deleted 2 globex-1", "deleted 5 globex-4", "deleted 8 globex-7", "deleted 11 globex-10")
	})
	t.Run("purged and republished", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 6)
		tr.checkpoint(3)
		audit, _ := tr.js.Stream(tr.ctx, subjects.StreamAudit)
		var copies [][2]string
		for seq := uint64(1); seq <= 6; seq++ {
			m, err := audit.GetMsg(tr.ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			data := string(m.Data)
			if seq == 4 {
				data = strings.Replace(data, `"n":3`, `"n":300`, 1)
			}
			copies = append(copies, [2]string{m.Subject, data})
		}
		if err := audit.Purge(tr.ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range copies {
			tr.publish(c[0], []byte(c[1]))
		}
		tr.flush() // the checkpointer covers the copies as it finds them
		r := tr.verify(auditchain.Options{})
		var want []string
		for seq := 1; seq <= 6; seq++ {
			want = append(want, fmt.Sprintf("deleted %d %s", seq, id(seq)), fmt.Sprintf("inserted %d %s", seq+6, id(seq)))
		}
		wantFindings(t, r, want...)
	})
	t.Run("stream deleted and recreated", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 10)
		tr.checkpoint(5)
		tr.loosen(subjects.StreamAudit)
		tr.fill(0, 10) // the same events again, at the same sequences
		r := tr.verify(auditchain.Options{})
		got := found(r)
		if !slices.Contains(got, "recreated-stream 6 ") || len(r.Findings) < 11 {
			t.Fatalf("findings %q, want the recreation and the ten events stored again", got)
		}
		for _, f := range r.Findings[1:] {
			if f.Kind != auditchain.KindInserted {
				t.Errorf("finding %v, want only the events stored again", f)
			}
		}
		if !slices.Contains(got, "inserted 3 "+id(3)) {
			t.Errorf("findings %q do not name event %s stored again", got, id(3))
		}
		// What came after, checked on its own, is intact.
		time.Sleep(10 * time.Millisecond)
		since := time.Now()
		from := tr.publish(event("acme", 100))
		tr.fill(101, 4)
		tr.flush()
		if r := tr.verify(auditchain.Options{From: from, Since: since}); !r.Intact() || r.Events < 5 {
			t.Errorf("events from %d, after the recreation: %+v %q", from, r, found(r))
		}
	})
	t.Run("checkpoint signed with another key", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 10)
		tr.checkpoint(5)
		tr.fill(10, 5)
		other := tr.key
		_, tr.key, _ = ed25519.GenerateKey(rand.Reader)
		// A writer with another key finds no checkpoint of its own and
		// starts a chain of its own over everything.
		tr.checkpoint(5)
		tr.key = other
		r := tr.verify(auditchain.Options{})
		wantFindings(t, r, "forged-checkpoint 1 ", "forged-checkpoint 6 ", "forged-checkpoint 11 ")
		if r.Checkpoints != 2 || r.CoveredLast != 10 {
			t.Errorf("report %+v, want the two genuine checkpoints over 1..10 verified", r)
		}
	})
	t.Run("checkpoint forged after the last one", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 10)
		tr.checkpoint(5)
		// A forgery at the chain's end, and junk after it: the writer
		// links past both to its own last checkpoint.
		tail, _ := auditchain.LastCheckpoint(tr.ctx, tr.js)
		forged := *tail.Checkpoint
		forged.First, forged.Last = 11, 15
		forged.Prev = tail.Checkpoint.Hash()
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		forged.Sign(other)
		b, _ := json.Marshal(forged)
		tr.publish(subjects.AuditCheckpoint, b)
		tr.publish(subjects.AuditCheckpoint, []byte("junk"))
		tr.fill(10, 5)
		tr.checkpoint(5)
		r := tr.verify(auditchain.Options{})
		got := found(r)
		if len(got) != 2 || !strings.HasPrefix(got[0], "forged-checkpoint 11") || !strings.HasPrefix(got[1], "forged-checkpoint 0") ||
			r.Checkpoints != 3 || r.CoveredLast != 15 {
			t.Fatalf("findings %q (%+v), want the forgery and the junk named, and the chain going on past them", got, r)
		}
	})
	t.Run("checkpoint deleted", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 15)
		tr.checkpoint(5)
		chain, _ := tr.js.Stream(tr.ctx, subjects.StreamAuditChain)
		if err := chain.DeleteMsg(tr.ctx, 2); err != nil {
			t.Fatal(err)
		}
		r := tr.verify(auditchain.Options{})
		got := found(r)
		if len(got) != 3 || !slices.Contains(got, "missing-checkpoint 0 ") || !slices.Contains(got, "missing-checkpoint 11 ") ||
			!slices.Contains(got, "uncovered 6 ") {
			t.Fatalf("findings %q, want the gap in the chain, the broken link and events 6..10 uncovered", got)
		}
	})
	t.Run("export altered or reordered", func(t *testing.T) {
		tr := newTrail(t)
		tr.fill(0, 10)
		tr.checkpoint(10)
		pub := tr.key.Public().(ed25519.PublicKey)
		b := tr.export(auditchain.ExportOptions{})
		lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
		edit := func(seq int, f func(m map[string]any)) []byte {
			out := slices.Clone(lines)
			for i, l := range out {
				var m map[string]any
				_ = json.Unmarshal(l, &m)
				if m["kind"] == "event" && m["seq"] == float64(seq) {
					f(m)
					out[i], _ = json.Marshal(m)
				}
			}
			return bytes.Join(out, []byte("\n"))
		}
		altered := edit(4, func(m map[string]any) {
			_, data := event("acme", 3)
			m["data"] = bytes.Replace(data, []byte(`"n":3`), []byte(`"n":4`), 1)
		})
		wantFindings(t, verifyFile(t, altered, pub), "altered 4 acme-3")
		// Events 3 and 4 swapped: each is found at the other's place.
		var d3, d4 any
		edit(3, func(m map[string]any) { d3 = []any{m["subject"], m["data"]} })
		edit(4, func(m map[string]any) { d4 = []any{m["subject"], m["data"]} })
		swapped := edit(3, func(m map[string]any) { m["subject"], m["data"] = d4.([]any)[0], d4.([]any)[1] })
		lines = bytes.Split(swapped, []byte("\n"))
		swapped = edit(4, func(m map[string]any) { m["subject"], m["data"] = d3.([]any)[0], d3.([]any)[1] })
		wantFindings(t, verifyFile(t, swapped, pub), "reordered 3 acme-3", "reordered 4 initech-2")
	})
}

// TestVerifyAgedOut: events AUDIT's age limit removed are noted, not
// reported.
func TestVerifyAgedOut(t *testing.T) {
	tr := newTrail(t)
	for _, c := range topology.Streams(topology.TopologyOptions{}) {
		if c.Name == subjects.StreamAudit {
			c.DenyDelete, c.DenyPurge, c.MaxAge, c.Duplicates = false, false, time.Second, time.Second
			if err := tr.js.DeleteStream(tr.ctx, c.Name); err != nil {
				t.Fatal(err)
			}
			if _, err := tr.js.CreateStream(tr.ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	tr.fill(0, 10)
	tr.checkpoint(5)
	natstest.Eventually(t, 10*time.Second, func() bool {
		st, err := tr.js.Stream(tr.ctx, subjects.StreamAudit)
		return err == nil && st.CachedInfo().State.Msgs == 0
	}, "the events to age out")
	tr.fill(10, 3)
	tr.flush()
	r := tr.verify(auditchain.Options{})
	if !r.Intact() || len(r.Notes) != 10 || r.Notes[0].Kind != auditchain.KindAgedOut {
		t.Fatalf("report %+v %q, want intact with the ten aged-out events noted", r, found(r))
	}
}

// TestChainWithWorkersKilled: three checkpointers run while events are
// published; two are stopped mid-way, one started late; one unbroken chain
// covers every event. In "from publish acks" each checkpointer is an
// audit process's, taking the leaves of what that process publishes: a
// process stopped takes its publishing with it, and what it published but
// had not covered is read back by the others.
func TestChainWithWorkersKilled(t *testing.T) {
	for _, acks := range []bool{false, true} {
		name := "read back"
		if acks {
			name = "from publish acks"
		}
		t.Run(name, func(t *testing.T) { chainWithWorkersKilled(t, acks, false) })
	}
	// Three audit processes MAC what they publish; every seventh event
	// is published by someone else: exactly those are named, not the
	// events acknowledged to a process killed before its checkpointer
	// took them.
	t.Run("attested", func(t *testing.T) { chainWithWorkersKilled(t, true, true) })
}

func chainWithWorkersKilled(t *testing.T, acks, attested bool) {
	tr := newTrail(t)
	if acks {
		pastCreation()
	}
	var foreign []string
	var mu sync.Mutex
	live := map[string]*publisher{}
	checkpointers := map[string]*auditchain.Checkpointer{}
	run := func(name string) context.CancelFunc {
		ctx, cancel := context.WithCancel(tr.ctx)
		c := &auditchain.Checkpointer{JS: tr.js, Key: tr.key, Every: 50, Interval: 40 * time.Millisecond, Writer: name}
		if acks {
			p := tr.publisher()
			if attested {
				p = tr.auditProcess()
				c.Events = auditchain.NewEventKey(tr.key)
			}
			c.Leaves = p.leaves
			mu.Lock()
			live[name] = p
			mu.Unlock()
		}
		mu.Lock()
		checkpointers[name] = c
		mu.Unlock()
		go c.Run(ctx)
		return func() {
			mu.Lock()
			delete(live, name)
			mu.Unlock()
			cancel()
		}
	}
	stopA, stopB := run("a"), run("b")
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 3000 {
			mu.Lock()
			var ps []*publisher
			for _, n := range []string{"a", "b", "c"} {
				if p := live[n]; p != nil {
					ps = append(ps, p)
				}
			}
			mu.Unlock()
			if len(ps) == 0 || i%7 == 0 {
				seq := tr.publish(event("acme", i))
				foreign = append(foreign, fmt.Sprintf("foreign %d acme-%d", seq, i))
			} else {
				ps[i%len(ps)].publish("acme", i, i%2 == 0)
			}
			switch i {
			case 800:
				stopA()
			case 1500:
				t.Cleanup(run("c"))
			case 2200:
				stopB()
			}
		}
	})
	wg.Wait()
	natstest.Eventually(t, 30*time.Second, func() bool {
		tail, err := auditchain.LastCheckpoint(tr.ctx, tr.js)
		return err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last == 3000
	}, "the chain to cover all 3000 events")
	r := tr.verify(auditchain.Options{})
	if attested {
		wantFindings(t, r, foreign...)
	} else if !r.Intact() {
		t.Fatalf("report %+v: %v", r, found(r))
	}
	if r.Events != 3000 || r.CoveredFirst != 1 || r.CoveredLast != 3000 {
		t.Fatalf("report %+v: %v", r, found(r))
	}
	writers := map[string]int{}
	stored, _ := auditchain.Bus{JS: tr.js}.Checkpoints(tr.ctx)
	for _, s := range stored {
		writers[s.Checkpoint.Writer]++
	}
	if writers["c"] == 0 || len(writers) < 2 {
		t.Errorf("checkpoints by writer %v: the late writer took over none", writers)
	}
	var fromAcks, readBack uint64
	mu.Lock()
	for _, c := range checkpointers {
		k, r := c.Covered()
		fromAcks, readBack = fromAcks+k, readBack+r
	}
	mu.Unlock()
	if acks && fromAcks == 0 {
		t.Errorf("no event covered from its publish ack (%d read back)", readBack)
	}
	t.Logf("%d checkpoints by writer %v; %d events covered from publish acks, %d read back", len(stored), writers, fromAcks, readBack)
}

var _ = nats.ErrTimeout
