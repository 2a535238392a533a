package auditchain

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"time"
)

// Kinds of finding. Those in Report.Findings mean the trail is not intact;
// those in Report.Notes do not.
const (
	// An event whose bytes differ from those checkpointed.
	KindAltered = "altered"
	// A checkpointed sequence that holds no event now.
	KindDeleted = "deleted"
	// An event at a checkpointed sequence that is not the one
	// checkpointed there, or a copy of a deleted event stored again.
	KindInserted = "inserted"
	// A checkpointed event found at another sequence of its checkpoint.
	KindReordered = "reordered"
	// AUDIT was deleted and created again: the checkpointed events of the
	// stream before are gone.
	KindRecreated = "recreated-stream"
	// No AUDIT stream.
	KindNoStream = "missing-stream"
	// A checkpoint whose signature does not verify with the key, or that
	// is not a checkpoint.
	KindForged = "forged-checkpoint"
	// A checkpoint missing from the chain: a gap in its stream, or a
	// checkpoint that does not link to the one before.
	KindMissingCheckpoint = "missing-checkpoint"
	// Sequences no checkpoint covers, between two that do: gone before
	// the checkpointer read them.
	KindUncovered = "uncovered"
	// A range whose root differs from its checkpoint's with no single
	// event to blame.
	KindRootMismatch = "root-mismatch"
	// An event no audit process wrote (published by another credential,
	// or put into the store), named by the checkpoint that covers it.
	KindForeign = "foreign"
	// Events after the last checkpoint: not yet covered (a note).
	KindTail = "unchecked-tail"
	// Checkpointed events older than AUDIT's age limit, gone as they
	// should be (a note).
	KindAgedOut = "aged-out"
	// Events covered by checkpoints of version 1, which do not say
	// whether audit wrote them (Report.Unattested).
	KindUnattested = "unattested"
)

// Finding is one thing Verify found, located by AUDIT sequence (Seq, and
// Last for a range) and event id where it knows them.
type Finding struct {
	Kind    string `json:"kind"`
	Seq     uint64 `json:"seq,omitempty"`
	Last    uint64 `json:"last,omitempty"`
	EventID string `json:"event_id,omitempty"`
	Tenant  string `json:"tenant,omitempty"`
	// Checkpoint is the checkpoint's sequence in AUDIT_CHAIN.
	Checkpoint uint64 `json:"checkpoint,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

func (f Finding) String() string {
	s := f.Kind
	switch {
	case f.Seq != 0 && f.Last > f.Seq:
		s += fmt.Sprintf(" seq %d..%d", f.Seq, f.Last)
	case f.Seq != 0:
		s += fmt.Sprintf(" seq %d", f.Seq)
	}
	if f.EventID != "" {
		s += " event " + f.EventID
	}
	if f.Tenant != "" {
		s += " tenant " + f.Tenant
	}
	if f.Checkpoint != 0 {
		s += fmt.Sprintf(" checkpoint %d", f.Checkpoint)
	}
	if f.Detail != "" {
		s += ": " + f.Detail
	}
	return s
}

// Report is what Verify found.
type Report struct {
	Findings []Finding `json:"findings"`
	Notes    []Finding `json:"notes"`
	// Unattested are the ranges covered by checkpoints that do not say
	// which events audit wrote (version 1: made before audit
	// authenticated its events, or on a bus without authentication,
	// where every stage publishes its own): events there that no audit
	// process wrote cannot be named. They do not fail the check.
	Unattested []Finding `json:"unattested,omitempty"`
	// Checkpoints verified, and the events they cover that were compared.
	Checkpoints int `json:"checkpoints"`
	Events      int `json:"events"`
	// Covered is the range of AUDIT sequences checked against checkpoints.
	CoveredFirst uint64 `json:"covered_first,omitempty"`
	CoveredLast  uint64 `json:"covered_last,omitempty"`
}

// Intact reports whether nothing was found wrong.
func (r *Report) Intact() bool { return len(r.Findings) == 0 }

// Options narrow Verify.
type Options struct {
	Key ed25519.PublicKey
	// From and To bound the AUDIT sequences whose events are compared (0:
	// no bound); the chain is always checked whole.
	From, To uint64
	// Since is the time From was found for: checkpoints of a stream
	// since created again, whose sequences are another stream's, are
	// judged by it.
	Since time.Time
	// Tenant reports only that tenant's events (and the chain's own
	// findings).
	Tenant string
	// Now is the time age limits are judged at (default time.Now).
	Now time.Time
}

// Verify checks the trail src holds against its checkpoints.
func Verify(ctx context.Context, src Source, o Options) (*Report, error) {
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	st, err := src.State(ctx)
	if err != nil {
		return nil, err
	}
	stored, err := src.Checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	if st.From > o.From {
		o.From = st.From
	}
	if st.To != 0 && (o.To == 0 || st.To < o.To) {
		o.To = st.To
	}
	v := &verifier{o: o, st: st, r: &Report{}, firstSeen: map[string]seen{}}
	cps := v.chain(stored)
	if !st.Exists {
		v.find(Finding{Kind: KindNoStream, Detail: "there is no AUDIT stream"})
	}
	// Ids of every checkpointed event, to tell a deleted event stored
	// again from a new one.
	for _, c := range cps {
		for i, id := range c.cp.IDs {
			if _, ok := v.firstSeen[id]; !ok && id != "" {
				v.firstSeen[id] = seen{seq: c.cp.First + uint64(i), epoch: c.cp.StreamCreated}
			}
		}
	}
	var last *link
	for i := range cps {
		c := &cps[i]
		if last != nil {
			v.between(last, c)
		}
		last = c
		if !v.inWindow(c.cp.First, c.cp.Last) {
			continue
		}
		if err := v.events(ctx, src, c); err != nil {
			return nil, err
		}
	}
	if st.Exists {
		if last != nil && last.cp.StreamCreated != st.Created && v.sinceWindow(last.cp) {
			v.recreated(last, fmt.Sprintf("AUDIT was created again at %s; the chain's last checkpoint covers the stream created at %s", st.Created, last.cp.StreamCreated))
		}
		tailFrom := st.First
		if last != nil && last.cp.StreamCreated == st.Created {
			tailFrom = max(last.cp.Last+1, st.First)
		}
		if st.Last >= tailFrom && st.Last > 0 && v.inWindow(tailFrom, st.Last) {
			if err := v.tail(ctx, src, tailFrom); err != nil {
				return nil, err
			}
		}
	}
	return v.r, nil
}

type link struct {
	seq uint64
	cp  *Checkpoint
}

type seen struct {
	seq   uint64
	epoch string
}

type verifier struct {
	o         Options
	st        StreamState
	r         *Report
	firstSeen map[string]seen
	// gone records checkpointed events found deleted, by id.
	gone map[string]bool
}

func (v *verifier) find(f Finding) {
	if v.o.Tenant != "" && f.Tenant != "" && f.Tenant != v.o.Tenant {
		return
	}
	v.r.Findings = append(v.r.Findings, f)
}

func (v *verifier) note(f Finding) { v.r.Notes = append(v.r.Notes, f) }

// sinceWindow reports whether cp, of a stream since created again (whose
// sequences are not the window's), holds events stored since Since.
func (v *verifier) sinceWindow(cp *Checkpoint) bool {
	if v.o.Since.IsZero() {
		return true
	}
	t, err := time.Parse(time.RFC3339Nano, cp.LastTime)
	return err != nil || !t.Before(v.o.Since)
}

func (v *verifier) inWindow(first, last uint64) bool {
	return (v.o.From == 0 || last >= v.o.From) && (v.o.To == 0 || first <= v.o.To)
}

// chain checks every checkpoint's signature and link, and returns the
// checkpoints that verify, in order.
func (v *verifier) chain(stored []Stored) []link {
	var out []link
	var prev *link
	want := v.st.ChainFirst
	for _, s := range stored {
		if want != 0 && s.Seq > want {
			v.find(Finding{Kind: KindMissingCheckpoint, Checkpoint: want,
				Detail: fmt.Sprintf("checkpoint stream sequences %d..%d are gone", want, s.Seq-1)})
		}
		want = s.Seq + 1
		if s.Err != nil {
			v.find(Finding{Kind: KindForged, Checkpoint: s.Seq, Detail: s.Err.Error()})
			continue
		}
		cp := s.Checkpoint
		if err := cp.Check(v.o.Key); err != nil {
			v.find(Finding{Kind: KindForged, Checkpoint: s.Seq, Seq: cp.First, Last: cp.Last, Detail: err.Error()})
			continue
		}
		switch {
		case prev == nil && cp.Prev != "" && s.Seq == 1:
			v.find(Finding{Kind: KindMissingCheckpoint, Checkpoint: s.Seq, Detail: "the first checkpoint links to one before it"})
		case prev != nil && cp.Prev != prev.cp.Hash():
			v.find(Finding{Kind: KindMissingCheckpoint, Checkpoint: s.Seq, Seq: cp.First, Last: cp.Last,
				Detail: fmt.Sprintf("does not link to checkpoint %d, the one before it", prev.seq)})
		}
		out = append(out, link{seq: s.Seq, cp: cp})
		prev = &out[len(out)-1]
	}
	v.r.Checkpoints = len(out)
	return out
}

// between checks what lies between two consecutive checkpoints, when it
// concerns the window.
func (v *verifier) between(a, b *link) {
	if !v.inWindow(a.cp.First, b.cp.Last) && a.cp.StreamCreated == b.cp.StreamCreated {
		return
	}
	if a.cp.StreamCreated != b.cp.StreamCreated {
		if !v.sinceWindow(a.cp) {
			return
		}
		v.recreated(a, fmt.Sprintf("AUDIT was created again (at %s) after checkpoint %d", b.cp.StreamCreated, a.seq))
		return
	}
	switch {
	case b.cp.First > a.cp.Last+1:
		v.find(Finding{Kind: KindUncovered, Seq: a.cp.Last + 1, Last: b.cp.First - 1, Checkpoint: b.seq,
			Detail: "gone before a checkpoint covered them"})
	case b.cp.First <= a.cp.Last:
		v.find(Finding{Kind: KindMissingCheckpoint, Seq: b.cp.First, Last: b.cp.Last, Checkpoint: b.seq,
			Detail: fmt.Sprintf("overlaps checkpoint %d", a.seq)})
	}
}

// recreated reports the events of the stream before a recreation, which
// the recreation removed (unless their age had removed them anyway).
func (v *verifier) recreated(c *link, detail string) {
	if v.agedOut(c.cp, c.cp.Last) {
		v.note(Finding{Kind: KindAgedOut, Seq: c.cp.First, Last: c.cp.Last, Checkpoint: c.seq, Detail: "before " + detail})
		return
	}
	v.find(Finding{Kind: KindRecreated, Seq: c.cp.First, Last: c.cp.Last, Checkpoint: c.seq, Detail: detail})
}

// agedOut reports whether event seq of cp may have left AUDIT by its age.
func (v *verifier) agedOut(cp *Checkpoint, seq uint64) bool {
	if v.st.MaxAge <= 0 {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, cp.FirstTime)
	if seq == cp.Last || err != nil {
		if t, err = time.Parse(time.RFC3339Nano, cp.LastTime); err != nil {
			return false
		}
	}
	return v.o.Now.Sub(t) >= v.st.MaxAge
}

// events compares the events of one checkpoint's range with it.
func (v *verifier) events(ctx context.Context, src Source, c *link) error {
	cp := c.cp
	if cp.StreamCreated != v.st.Created {
		return nil // reported as recreated
	}
	n := cp.Size()
	leaves := make([]Hash, n)
	for i := range leaves {
		leaves[i] = absentLeaf
	}
	present := make([]*Event, n)
	err := src.Events(ctx, cp.First, cp.Last, func(e Event) error {
		if e.Seq < cp.First || e.Seq > cp.Last {
			return nil
		}
		i := e.Seq - cp.First
		leaves[i] = LeafHash(e.Subject, e.Data)
		present[i] = &e
		return nil
	})
	if err != nil {
		return err
	}
	v.r.Events += int(n)
	if v.r.CoveredFirst == 0 || cp.First < v.r.CoveredFirst {
		v.r.CoveredFirst = cp.First
	}
	v.r.CoveredLast = max(v.r.CoveredLast, cp.Last)
	v.foreign(c)
	root, _ := cp.root()
	partial := v.st.Tenant != ""
	if !partial && Root(leaves) == root {
		for i := range n {
			if present[i] == nil { // an absent leaf, checkpointed as such
				v.deleted(c, i, "deleted before it was checkpointed")
			} else {
				v.copyOf(*present[i], cp.IDs[i])
			}
		}
		return nil
	}
	// Where the root differs (or only one tenant's events are here):
	// name each event against the listed leaf prefixes.
	where := map[string]uint64{}
	for i := range n {
		where[string(cp.leafPrefix(i))] = i
	}
	blamed := false
	for i := range n {
		want := cp.leafPrefix(i)
		if partial && cp.Tenants[i] != v.st.Tenant {
			continue
		}
		e := present[i]
		seq := cp.First + i
		if e == nil {
			blamed = true
			if bytes.Equal(want, absentLeaf[:prefixLen]) {
				v.deleted(c, i, "deleted before it was checkpointed")
			} else {
				v.deleted(c, i, "")
			}
			continue
		}
		if bytes.Equal(leaves[i][:prefixLen], want) && v.proven(e, leaves[i], i, cp, root) {
			v.copyOf(*e, cp.IDs[i])
			continue
		}
		blamed = true
		id, tenant := eventID(e.Data), tenantOf(e.Subject)
		switch j, ok := where[string(leaves[i][:prefixLen])]; {
		case ok:
			v.find(Finding{Kind: KindReordered, Seq: seq, EventID: id, Tenant: tenant, Checkpoint: c.seq,
				Detail: fmt.Sprintf("checkpointed at seq %d", cp.First+j)})
		case id != "" && id == cp.IDs[i]:
			v.find(Finding{Kind: KindAltered, Seq: seq, EventID: id, Tenant: tenant, Checkpoint: c.seq})
		default:
			v.find(Finding{Kind: KindInserted, Seq: seq, EventID: id, Tenant: tenant, Checkpoint: c.seq,
				Detail: fmt.Sprintf("checkpointed there: event %q", cp.IDs[i])})
		}
	}
	if !partial && !blamed {
		v.find(Finding{Kind: KindRootMismatch, Seq: cp.First, Last: cp.Last, Checkpoint: c.seq,
			Detail: "root " + hex.EncodeToString(root[:8]) + "… does not match the events"})
	}
	return nil
}

// foreign names the events of c that its checkpoint says no audit process
// wrote; of a checkpoint that does not say, it notes the range.
func (v *verifier) foreign(c *link) {
	cp := c.cp
	if !cp.Attested() {
		u := &v.r.Unattested
		if k := len(*u) - 1; k >= 0 && (*u)[k].Last+1 == cp.First {
			(*u)[k].Last = cp.Last
			return
		}
		*u = append(*u, Finding{Kind: KindUnattested, Seq: cp.First, Last: cp.Last, Checkpoint: c.seq,
			Detail: "checkpoints of version 1 do not say which events audit wrote"})
		return
	}
	for _, seq := range cp.Foreign {
		i := seq - cp.First
		if !v.inWindow(seq, seq) || v.st.Tenant != "" && cp.Tenants[i] != v.st.Tenant {
			continue
		}
		v.find(Finding{Kind: KindForeign, Seq: seq, EventID: cp.IDs[i], Tenant: cp.Tenants[i], Checkpoint: c.seq,
			Detail: "no audit process wrote it"})
	}
}

// proven checks an event's inclusion proof, when it comes with one (an
// export of one tenant, whose checkpoints' other leaves are not there).
func (v *verifier) proven(e *Event, leaf Hash, i uint64, cp *Checkpoint, root Hash) bool {
	if e.Proof == nil {
		return true
	}
	return VerifyInclusion(leaf, i, cp.Size(), e.Proof, root) == nil
}

func (v *verifier) deleted(c *link, i uint64, detail string) {
	seq := c.cp.First + i
	if seq < v.st.First && v.agedOut(c.cp, seq) {
		v.note(Finding{Kind: KindAgedOut, Seq: seq, EventID: c.cp.IDs[i], Tenant: c.cp.Tenants[i], Checkpoint: c.seq})
		return
	}
	if v.gone == nil {
		v.gone = map[string]bool{}
	}
	if id := c.cp.IDs[i]; id != "" {
		v.gone[id] = true
	}
	v.find(Finding{Kind: KindDeleted, Seq: seq, EventID: c.cp.IDs[i], Tenant: c.cp.Tenants[i], Checkpoint: c.seq, Detail: detail})
}

// copyOf reports e if it is a checkpointed event stored again after the
// original was deleted (or its stream was): purged and republished.
func (v *verifier) copyOf(e Event, id string) {
	s, ok := v.firstSeen[id]
	if !ok || s.seq == e.Seq && s.epoch == v.st.Created {
		return
	}
	if v.gone[id] || s.epoch != v.st.Created {
		v.find(Finding{Kind: KindInserted, Seq: e.Seq, EventID: id, Tenant: tenantOf(e.Subject),
			Detail: fmt.Sprintf("a copy of the event checkpointed at seq %d, which is gone", s.seq)})
	}
}

// tail reports the events after the last checkpoint, and any of them that
// is a checkpointed event stored again after it was deleted.
func (v *verifier) tail(ctx context.Context, src Source, from uint64) error {
	n, first, last := 0, uint64(0), uint64(0)
	err := src.Events(ctx, from, v.st.Last, func(e Event) error {
		if first == 0 {
			first = e.Seq
		}
		last = e.Seq
		n++
		v.copyOf(e, eventID(e.Data))
		return nil
	})
	if err != nil {
		return err
	}
	if n > 0 {
		v.note(Finding{Kind: KindTail, Seq: first, Last: last,
			Detail: fmt.Sprintf("%d events after the last checkpoint, not yet covered", n)})
	}
	return nil
}
