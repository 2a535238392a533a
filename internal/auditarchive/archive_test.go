package auditarchive_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditarchive"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// trail is a bus with toolgate's topology, audit events and signed
// checkpoints over them.
type trail struct {
	t   *testing.T
	js  jetstream.JetStream
	key ed25519.PrivateKey
	pub ed25519.PublicKey
	ctx context.Context
	n   int
}

func newTrail(t *testing.T) *trail {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	tr := &trail{t: t, js: js, ctx: ctx}
	tr.pub, tr.key, _ = ed25519.GenerateKey(rand.Reader)
	return tr
}

// add publishes n events over three tenants, and checkpoints them all,
// every events a checkpoint.
func (tr *trail) add(n, every int) {
	tr.t.Helper()
	tenants := []string{"acme", "globex", "initech"}
	for range n {
		tr.n++
		data := fmt.Appendf(nil, `{"specversion":"1.0","id":"inv-%d:tool.succeeded","type":"ai.agent.tool.succeeded","data":{"n":%d}}`, tr.n, tr.n)
		if _, err := tr.js.Publish(tr.ctx, subjects.AuditEvent(tenants[tr.n%3], "tool.succeeded"), data); err != nil {
			tr.t.Fatal(err)
		}
	}
	c := &auditchain.Checkpointer{JS: tr.js, Key: tr.key, Every: every, Interval: time.Nanosecond, Writer: "test"}
	for range 1000 {
		more, err := c.Step(tr.ctx)
		if err != nil {
			tr.t.Fatal(err)
		}
		if !more {
			return
		}
	}
}

// natsStore is the default archive, in a bucket the test may change
// (deletes allowed): what someone holding the store can do anyway.
func (tr *trail) natsStore() (*archivestore.NATS, jetstream.ObjectStore) {
	if err := tr.js.DeleteObjectStore(tr.ctx, subjects.BucketAuditArchive); err != nil {
		tr.t.Fatal(err)
	}
	obs, err := tr.js.CreateObjectStore(tr.ctx, jetstream.ObjectStoreConfig{Bucket: subjects.BucketAuditArchive})
	if err != nil {
		tr.t.Fatal(err)
	}
	return archivestore.NewNATS(tr.js, subjects.BucketAuditArchive), obs
}

func (tr *trail) archiver(store archivestore.Store) *auditarchive.Archiver {
	return &auditarchive.Archiver{JS: tr.js, Store: store, Key: tr.pub, MaxEvents: 100}
}

func names(rs []auditarchive.Range) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%d-%d", r.First, r.Last))
	}
	return out
}

func findings(r *auditarchive.Report) string {
	var b strings.Builder
	for _, f := range r.Findings {
		b.WriteString(f.String() + "\n")
	}
	return b.String()
}

func TestArchiveClosedRangesAndVerifyTheChainAcrossThem(t *testing.T) {
	tr := newTrail(t)
	store, _ := tr.natsStore()
	a := tr.archiver(store)
	tr.add(250, 50) // five checkpoints of 50
	got, err := a.Once(tr.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// At most 100 events an object: two checkpoints each, then the fifth.
	if want := "[1-100 101-200 201-250]"; fmt.Sprint(names(got)) != want {
		t.Fatalf("archived %v, want %s", names(got), want)
	}
	// Events after the last checkpoint are not a closed range.
	for i := range 7 {
		data := fmt.Appendf(nil, `{"specversion":"1.0","id":"tail-%d","type":"ai.agent.tool.succeeded"}`, i)
		if _, err := tr.js.Publish(tr.ctx, subjects.AuditEvent("acme", "tool.succeeded"), data); err != nil {
			t.Fatal(err)
		}
	}
	tr.n += 7
	if got, err := a.Once(tr.ctx); err != nil || len(got) != 0 {
		t.Fatalf("a second run archived %v (%v), want nothing", names(got), err)
	}
	tr.add(30, 50)
	got, err = a.Once(tr.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[251-287]"; fmt.Sprint(names(got)) != want {
		t.Fatalf("archived %v, want %s", names(got), want)
	}
	rep, err := auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Intact() || rep.Objects != 4 || rep.Events != 287 {
		t.Fatalf("archive: %d objects, %d events, findings:\n%s", rep.Objects, rep.Events, findings(rep))
	}
	// Each object is an export that audit verify --file reads alone.
	data, err := store.Get(tr.ctx, got[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	f, err := auditchain.ReadFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := auditchain.Verify(tr.ctx, f, auditchain.Options{Key: tr.pub}); err != nil || !r.Intact() || r.Events != 37 {
		t.Fatalf("object %s alone: %+v %v", got[0].Name, r, err)
	}
	r, err := auditarchive.Find(tr.ctx, store, "150")
	if err != nil || r.First != 101 || r.Last != 200 {
		t.Fatalf("the object of seq 150: %+v %v", r, err)
	}
}

func TestArchiveVerifyNamesAMissingAndAnAlteredObject(t *testing.T) {
	tr := newTrail(t)
	store, obs := tr.natsStore()
	a := tr.archiver(store)
	tr.add(300, 100)
	got, err := a.Once(tr.ctx)
	if err != nil || len(got) != 3 {
		t.Fatalf("archived %v, %v", names(got), err)
	}
	// The middle object removed: the gap is named, by sequence.
	if err := obs.Delete(tr.ctx, got[1].Name); err != nil {
		t.Fatal(err)
	}
	rep, err := auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Intact() || !strings.Contains(findings(rep), "archive-gap seq 101..200") {
		t.Fatalf("a missing object not named:\n%s", findings(rep))
	}
	// The first object put back with one event changed.
	data, err := store.Get(tr.ctx, got[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(data, []byte(`"kind":"event"`))
	j := bytes.Index(data[i:], []byte(`"data":"`)) + i + len(`"data":"`)
	data[j+5] ^= 0x01 // one base64 character of the event's bytes
	if err := obs.Delete(tr.ctx, got[0].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.PutBytes(tr.ctx, got[0].Name, data); err != nil {
		t.Fatal(err)
	}
	rep, err = auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil {
		t.Fatal(err)
	}
	out := findings(rep)
	if !strings.Contains(out, "altered seq 1 event inv-1:tool.succeeded") || !strings.Contains(out, "object "+got[0].Name) {
		t.Fatalf("an altered object not named:\n%s", out)
	}
}

// TestArchiveVerifyNamesAMissingLastObject: each run ends with a head
// object naming, with its signed checkpoint, the last range archived, so
// that the last object removed, or the archive rolled back to an earlier
// run, is named offline (E3968); the last object altered is named too.
func TestArchiveVerifyNamesAMissingLastObject(t *testing.T) {
	tr := newTrail(t)
	store, obs := tr.natsStore()
	a := tr.archiver(store)
	tr.add(200, 100)
	first, err := a.Once(tr.ctx)
	if err != nil || len(first) != 2 {
		t.Fatalf("archived %v, %v", names(first), err)
	}
	tr.add(100, 100)
	got, err := a.Once(tr.ctx)
	if err != nil || fmt.Sprint(names(got)) != "[201-300]" {
		t.Fatalf("archived %v, %v", names(got), err)
	}
	verify := func() (*auditarchive.Report, string) {
		t.Helper()
		rep, err := auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
		if err != nil {
			t.Fatal(err)
		}
		return rep, findings(rep)
	}
	if rep, out := verify(); !rep.Intact() || rep.Objects != 3 || rep.Events != 300 {
		t.Fatalf("the archive: %+v\n%s", rep, out)
	}
	last, err := store.Get(tr.ctx, got[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	// The last object removed: the run before's objects are all there,
	// but the head names 300.
	if err := obs.Delete(tr.ctx, got[0].Name); err != nil {
		t.Fatal(err)
	}
	rep, out := verify()
	if rep.Intact() || !strings.Contains(out, "archive-truncated seq 201..300") || !strings.Contains(out, api.EAuditArchiveTruncated) {
		t.Fatalf("the last object removed, not named:\n%s", out)
	}
	// Put back altered (an event's bytes, its object's digest): named.
	i := bytes.LastIndex(last, []byte(`"kind":"event"`))
	j := bytes.Index(last[i:], []byte(`"data":"`)) + i + len(`"data":"`)
	last[j+5] ^= 0x01
	if _, err := obs.PutBytes(tr.ctx, got[0].Name, last); err != nil {
		t.Fatal(err)
	}
	if rep, out := verify(); rep.Intact() || !strings.Contains(out, "altered seq") || !strings.Contains(out, "object "+got[0].Name) {
		t.Fatalf("the last object altered, not named:\n%s", out)
	}
	// A head that is not audit's: its checkpoint's signature fails.
	heads, err := store.List(tr.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range heads {
		if strings.HasPrefix(o.Name, "HEAD-") {
			b, _ := store.Get(tr.ctx, o.Name)
			b = bytes.Replace(b, []byte(`"writer":"test"`), []byte(`"writer":"tset"`), 1)
			_ = obs.Delete(tr.ctx, o.Name)
			if _, err := obs.PutBytes(tr.ctx, o.Name, b); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if rep, out := verify(); rep.Intact() || !strings.Contains(out, "bad-object") || !strings.Contains(out, "HEAD-") {
		t.Fatalf("a forged head, not named:\n%s", out)
	}
}
