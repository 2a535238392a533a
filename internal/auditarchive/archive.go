// Package auditarchive copies closed ranges of AUDIT (ranges that end at a
// signed checkpoint), with their checkpoints, to cold storage, and checks
// the archive and the chain across it (docs/audit.md). An object is an
// export as `toolgate audit verify --file` reads it, one per range, named
// by the stream's creation time and the range's first and last sequences;
// each run ends with a head object naming its last object, with that
// range's signed checkpoint, so that an archive missing its last objects
// is told from the archive alone.
package auditarchive

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/backoff"
)

// DefaultMaxEvents bounds the events of one object: an hour's archive of a
// busy gateway is several objects, each read back whole.
const DefaultMaxEvents = 20_000

// epochLayout writes the stream's creation time in an object's name:
// sortable, and without a colon (which some file systems refuse).
const epochLayout = "20060102T150405.000000000Z"

// Range is one archived object: the AUDIT stream it is of (its creation
// time) and the sequences it holds, both included.
type Range struct {
	Name    string    `json:"name"`
	Created time.Time `json:"stream_created"`
	First   uint64    `json:"first"`
	Last    uint64    `json:"last"`
	Size    int64     `json:"size"`
	// Of an object this run wrote: its SHA-256 and last checkpoint, which
	// its head names.
	digest [sha256.Size]byte
	last   *auditchain.Checkpoint
}

// Head is what a head object holds: the last range a run archived, named
// with its size and digest, and the range's last checkpoint (of version 3
// its signed head alone: the listing is in the object). The checkpoint's
// signature is what makes a head audit's: no one without the chain key can
// write a head naming a range audit has not checkpointed, so an archive
// whose objects end before its newest head has lost its last objects.
type Head struct {
	V          int                    `json:"v"`
	Object     string                 `json:"object"`
	Size       int64                  `json:"size"`
	SHA256     string                 `json:"sha256"`
	Checkpoint *auditchain.Checkpoint `json:"checkpoint"`
	name       string                 // the head object's, as read
}

// HeadName is the name of the head written after the range of the AUDIT
// stream created at created that ends at last.
func HeadName(created time.Time, last uint64) string {
	return fmt.Sprintf("HEAD-%s-%020d.json", created.UTC().Format(epochLayout), last)
}

// parseHeadName reads a name HeadName wrote.
func parseHeadName(name string) (created time.Time, last uint64, ok bool) {
	s, ok := strings.CutPrefix(name, "HEAD-")
	if !ok {
		return time.Time{}, 0, false
	}
	s, ok = strings.CutSuffix(s, ".json")
	t, n, cut := strings.Cut(s, "-")
	if !ok || !cut {
		return time.Time{}, 0, false
	}
	created, err := time.Parse(epochLayout, t)
	last, err1 := strconv.ParseUint(n, 10, 64)
	if err != nil || err1 != nil || last == 0 {
		return time.Time{}, 0, false
	}
	return created, last, true
}

// ObjectName is the name of the object holding first..last of the AUDIT
// stream created at created: zero-padded, so a listing sorts by coverage.
func ObjectName(created time.Time, first, last uint64) string {
	return fmt.Sprintf("AUDIT-%s-%020d-%020d.jsonl", created.UTC().Format(epochLayout), first, last)
}

// ParseName reads a name ObjectName wrote.
func ParseName(name string) (Range, bool) {
	s, ok := strings.CutPrefix(name, "AUDIT-")
	if !ok {
		return Range{}, false
	}
	s, ok = strings.CutSuffix(s, ".jsonl")
	parts := strings.Split(s, "-")
	if !ok || len(parts) != 3 {
		return Range{}, false
	}
	t, err := time.Parse(epochLayout, parts[0])
	first, err1 := strconv.ParseUint(parts[1], 10, 64)
	last, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err != nil || err1 != nil || err2 != nil || first == 0 || last < first {
		return Range{}, false
	}
	return Range{Name: name, Created: t, First: first, Last: last}, true
}

// Ranges lists the archive's objects that are ranges, ordered by stream
// and sequence; others are returned apart.
func Ranges(ctx context.Context, store archivestore.Store) (ranges []Range, others []archivestore.Object, err error) {
	objs, err := store.List(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, o := range objs {
		r, ok := ParseName(o.Name)
		if !ok {
			others = append(others, o)
			continue
		}
		r.Size = o.Size
		ranges = append(ranges, r)
	}
	slices.SortFunc(ranges, func(a, b Range) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		if a.First != b.First {
			return cmpU(a.First, b.First)
		}
		return cmpU(a.Last, b.Last)
	})
	return ranges, others, nil
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Archiver copies closed ranges of AUDIT to Store.
type Archiver struct {
	JS    jetstream.JetStream
	Store archivestore.Store
	// Key is the public audit chain key the checkpoints are checked with.
	Key ed25519.PublicKey
	// MaxEvents bounds an object's events (DefaultMaxEvents).
	MaxEvents int
	Log       *slog.Logger
	// Archived and Failed are told of each object archived and each
	// attempt that failed (metrics, the audit event); either may be nil.
	Archived func(ctx context.Context, r Range, findings int)
	Failed   func(ctx context.Context, attempt int, err error)
}

// Once archives every closed range not archived yet, oldest first, and
// returns the objects it wrote. A range is archived only after it is read
// back whole, with its size and digest the same and its checkpoints'
// roots found again from its events; nothing is ever removed from AUDIT.
func (a *Archiver) Once(ctx context.Context) ([]Range, error) {
	bus := auditchain.Bus{JS: a.JS}
	st, err := bus.State(ctx)
	if err != nil {
		return nil, err
	}
	if !st.Exists {
		return nil, nil
	}
	created, err := time.Parse(time.RFC3339Nano, st.Created)
	if err != nil {
		return nil, err
	}
	stored, err := bus.Checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	have, _, err := Ranges(ctx, a.Store)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", a.Store, err)
	}
	var done uint64
	for _, r := range have {
		if r.Created.Equal(created) {
			done = max(done, r.Last)
		}
	}
	maxEvents := uint64(a.MaxEvents)
	if maxEvents == 0 {
		maxEvents = DefaultMaxEvents
	}
	var out []Range
	start := -1 // index in stored of the open group's first checkpoint
	var first, last uint64
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		r, err := a.archive(ctx, bus, st, created, stored[start:end+1], first, last)
		if err != nil {
			return err
		}
		out = append(out, r)
		start = -1
		return nil
	}
	for i, s := range stored {
		cp := s.Checkpoint
		if s.Err != nil || cp.StreamCreated != st.Created || cp.Last <= done || cp.Check(a.Key) != nil {
			continue
		}
		if cp.First < st.First || cp.First <= done {
			// Partly gone from AUDIT (aged out, or before the stream's
			// first) or partly archived: not a whole range.
			if a.Log != nil && done == 0 {
				a.Log.Warn("audit range not archived: its first events are gone from AUDIT", "first", cp.First, "last", cp.Last)
			}
			continue
		}
		if start >= 0 && last-first+1+cp.Size() > maxEvents {
			if err := flush(i - 1); err != nil {
				return out, err
			}
		}
		if start < 0 {
			start, first = i, cp.First
		}
		last = cp.Last
	}
	if start >= 0 {
		// The group ends at its last checkpoint of this stream.
		end := len(stored) - 1
		for end > start && (stored[end].Err != nil || stored[end].Checkpoint.Last != last) {
			end--
		}
		if err := flush(end); err != nil {
			return out, errors.Join(err, a.writeHead(ctx, out))
		}
	}
	return out, a.writeHead(ctx, out)
}

// writeHead writes, after the objects of a run, the head naming the last
// of them, and reads it back.
func (a *Archiver) writeHead(ctx context.Context, out []Range) error {
	if len(out) == 0 {
		return nil
	}
	r := out[len(out)-1]
	cp := r.last
	if h := cp.Head(); h != nil {
		cp = h
	}
	b, err := json.Marshal(Head{V: 1, Object: r.Name, Size: r.Size, SHA256: hex.EncodeToString(r.digest[:]), Checkpoint: cp})
	if err != nil {
		return err
	}
	name := HeadName(r.Created, r.Last)
	if err := a.Store.Put(ctx, name, bytes.NewReader(b), int64(len(b))); err != nil && !errors.Is(err, archivestore.ErrExists) {
		return fmt.Errorf("storing %s in %s: %w", name, a.Store, err)
	}
	back, err := a.readBack(ctx, name)
	if err != nil {
		return fmt.Errorf("reading %s back from %s: %w", name, a.Store, err)
	}
	if !bytes.Equal(back, b) {
		return fmt.Errorf("%s read back from %s differs from what was written", name, a.Store)
	}
	return nil
}

// readBackFor bounds how long an object just stored may stay unseen.
const readBackFor = 5 * time.Second

// readBack reads the object just stored as name. On a replicated bucket
// the read may be answered by a replica that has not yet applied the
// write (JetStream's direct get), so "not found" is asked again for a
// while before it counts.
func (a *Archiver) readBack(ctx context.Context, name string) ([]byte, error) {
	deadline := time.Now().Add(readBackFor)
	for n := 0; ; n++ {
		back, err := a.Store.Get(ctx, name)
		if !errors.Is(err, archivestore.ErrNotFound) || time.Now().After(deadline) {
			return back, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff.Exponential(n, 50*time.Millisecond, time.Second)):
		}
	}
}

// archive writes one range, reads it back and checks it.
func (a *Archiver) archive(ctx context.Context, bus auditchain.Bus, st auditchain.StreamState, created time.Time,
	cps []auditchain.Stored, first, last uint64) (Range, error) {
	src := rangeSource{bus: bus, st: auditchain.StreamState{Exists: true, Created: st.Created, First: first, Last: last,
		ChainFirst: cps[0].Seq}, cps: cps}
	var buf bytes.Buffer
	if _, err := auditchain.Export(ctx, src, &buf, auditchain.ExportOptions{From: first, To: last}); err != nil {
		return Range{}, fmt.Errorf("exporting %d..%d: %w", first, last, err)
	}
	r := Range{Name: ObjectName(created, first, last), Created: created, First: first, Last: last, Size: int64(buf.Len()),
		digest: sha256.Sum256(buf.Bytes())}
	for _, c := range slices.Backward(cps) {
		if c.Err == nil && c.Checkpoint.Last == last && c.Checkpoint.Check(a.Key) == nil {
			r.last = c.Checkpoint
			break
		}
	}
	if r.last == nil {
		return Range{}, fmt.Errorf("no checkpoint of %d..%d ends it", first, last)
	}
	err := a.Store.Put(ctx, r.Name, bytes.NewReader(buf.Bytes()), r.Size)
	if err != nil && !errors.Is(err, archivestore.ErrExists) {
		return Range{}, fmt.Errorf("storing %s in %s: %w", r.Name, a.Store, err)
	}
	// An object found there already is one an earlier run stored and did
	// not confirm: it must be the same bytes.
	back, err := a.readBack(ctx, r.Name)
	if err != nil {
		return Range{}, fmt.Errorf("reading %s back from %s: %w", r.Name, a.Store, err)
	}
	if len(back) != buf.Len() || sha256.Sum256(back) != r.digest {
		return Range{}, fmt.Errorf("%s read back from %s: %d bytes, not the %d written", r.Name, a.Store, len(back), buf.Len())
	}
	rep, err := checkObject(ctx, back, a.Key)
	if err != nil {
		return Range{}, fmt.Errorf("%s read back: %w", r.Name, err)
	}
	for _, f := range rep.Findings {
		if f.Kind == auditchain.KindRootMismatch || f.Kind == auditchain.KindForged {
			return Range{}, fmt.Errorf("%s read back: %s", r.Name, f)
		}
	}
	if a.Log != nil {
		a.Log.Info("audit range archived", "object", r.Name, "store", a.Store.String(), "bytes", r.Size, "findings", len(rep.Findings))
	}
	if a.Archived != nil {
		a.Archived(ctx, r, len(rep.Findings))
	}
	return r, nil
}

// checkObject verifies one object against its checkpoints.
func checkObject(ctx context.Context, data []byte, key ed25519.PublicKey) (*auditchain.Report, error) {
	f, err := auditchain.ReadFile(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	return auditchain.Verify(ctx, f, auditchain.Options{Key: key})
}

// Run archives every interval until ctx ends. A run that fails is tried
// again with backoff (from a second up to the interval), each failure told
// to Failed; what was archived stays, and the next run goes on after it.
func (a *Archiver) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTimer(interval)
	defer t.Stop()
	attempt := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := a.Once(ctx)
		if ctx.Err() != nil {
			return
		}
		next := interval
		if err != nil {
			attempt++
			if a.Log != nil {
				a.Log.Warn("archiving the audit trail failed; retrying", "attempt", attempt, "err", err)
			}
			if a.Failed != nil {
				a.Failed(ctx, attempt, err)
			}
			next = min(interval, backoff.FullJitter(attempt, time.Second, interval))
		} else {
			attempt = 0
		}
		t.Reset(next)
	}
}

// rangeSource is the bus narrowed to one range: the stream as if it held
// only first..last, and the chain only the checkpoints over them.
type rangeSource struct {
	bus auditchain.Bus
	st  auditchain.StreamState
	cps []auditchain.Stored
}

func (s rangeSource) State(context.Context) (auditchain.StreamState, error) { return s.st, nil }

func (s rangeSource) Checkpoints(context.Context) ([]auditchain.Stored, error) { return s.cps, nil }

func (s rangeSource) Events(ctx context.Context, first, last uint64, fn func(auditchain.Event) error) error {
	return s.bus.Events(ctx, max(first, s.st.First), min(last, s.st.Last), fn)
}
