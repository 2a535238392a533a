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
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditchain"
)

// Kinds of finding of an archive, besides those of each object's own
// check (auditchain's kinds, named with their object).
const (
	// Sequences of a stream between two objects that no object holds,
	// or two objects whose checkpoints do not link: an object missing.
	KindGap = "archive-gap"
	// An object that cannot be read, is not an export, or holds other
	// sequences than its name says.
	KindBadObject = "bad-object"
	// An object whose name is not a range's nor a head's.
	KindStray = "stray-object"
	// Sequences the newest head of a stream names that no object holds:
	// the last objects removed, or the archive rolled back (E3968).
	KindTruncated = "archive-truncated"
)

// Finding is one thing wrong with the archive; Object names the object.
type Finding struct {
	auditchain.Finding
	Object string `json:"object,omitempty"`
}

func (f Finding) String() string {
	if f.Object == "" {
		return f.Finding.String()
	}
	return f.Finding.String() + " object " + f.Object
}

// Report is what VerifyArchive found.
type Report struct {
	Objects     int       `json:"objects"`
	Heads       int       `json:"heads"`
	Checkpoints int       `json:"checkpoints"`
	Events      int       `json:"events"`
	Ranges      []Range   `json:"ranges"`
	Findings    []Finding `json:"findings"`
}

// Intact reports whether nothing was found wrong.
func (r *Report) Intact() bool { return len(r.Findings) == 0 }

// VerifyArchive checks every object of store against its checkpoints, and
// the chain across the objects of each stream: each object's first
// checkpoint must link to the previous object's last, and its first
// sequence follow that object's last; and the end of each stream's
// objects against its newest head: the object it names must be there, as
// it was written.
func VerifyArchive(ctx context.Context, store archivestore.Store, key ed25519.PublicKey) (*Report, error) {
	ranges, others, err := Ranges(ctx, store)
	if err != nil {
		return nil, err
	}
	rep := &Report{Ranges: ranges}
	heads := map[int64]*Head{} // the newest of each stream, by its creation
	for _, o := range others {
		created, last, ok := parseHeadName(o.Name)
		if !ok {
			rep.Findings = append(rep.Findings, Finding{Object: o.Name,
				Finding: auditchain.Finding{Kind: KindStray, Detail: "not an archived range's name"}})
			continue
		}
		rep.Heads++
		h, err := readHead(ctx, store, o.Name, created, last, key)
		if err != nil {
			rep.Findings = append(rep.Findings, Finding{Object: o.Name,
				Finding: auditchain.Finding{Kind: KindBadObject, Seq: last, Last: last, Detail: err.Error()}})
			continue
		}
		if k := created.UnixNano(); heads[k] == nil || heads[k].Checkpoint.Last < last {
			heads[k] = h
		}
	}
	digests := map[string]string{}
	var prev *Range
	var prevLast *auditchain.Checkpoint
	for i := range ranges {
		r := &ranges[i]
		rep.Objects++
		bad := func(detail string) {
			rep.Findings = append(rep.Findings, Finding{Object: r.Name,
				Finding: auditchain.Finding{Kind: KindBadObject, Seq: r.First, Last: r.Last, Detail: detail}})
		}
		first, last, digest, err := readObject(ctx, store, r, key, rep)
		digests[r.Name] = digest
		if err != nil {
			bad(err.Error())
		}
		if prev != nil && prev.Created.Equal(r.Created) {
			switch {
			case r.First > prev.Last+1:
				rep.Findings = append(rep.Findings, Finding{Object: r.Name, Finding: auditchain.Finding{Kind: KindGap,
					Seq: prev.Last + 1, Last: r.First - 1, Detail: "held by no object, between " + prev.Name + " and " + r.Name}})
			case r.First <= prev.Last:
				rep.Findings = append(rep.Findings, Finding{Object: r.Name, Finding: auditchain.Finding{Kind: KindBadObject,
					Seq: r.First, Last: r.Last, Detail: "overlaps " + prev.Name}})
			case first != nil && prevLast != nil && first.Prev != prevLast.Hash():
				rep.Findings = append(rep.Findings, Finding{Object: r.Name, Finding: auditchain.Finding{Kind: KindGap,
					Seq: r.First, Last: r.Last, Detail: "its first checkpoint does not link to the last of " + prev.Name}})
			}
		}
		prev, prevLast = r, last
	}
	for _, k := range slices.Sorted(maps.Keys(heads)) {
		h := heads[k]
		var end uint64 // the stream's last sequence an object holds
		for _, r := range ranges {
			if r.Created.UnixNano() == k {
				end = max(end, r.Last)
			}
		}
		hl := h.Checkpoint.Last
		switch d, ok := digests[h.Object]; {
		case end < hl:
			rep.Findings = append(rep.Findings, Finding{Object: h.Object, Finding: auditchain.Finding{Kind: KindTruncated,
				Seq: end + 1, Last: hl, Detail: fmt.Sprintf("%s: the archive's head %s names them, in %s, which is not there: "+
					"its last objects were removed, or the archive rolled back", api.EAuditArchiveTruncated, h.name, h.Object)}})
		case ok && d != h.SHA256:
			rep.Findings = append(rep.Findings, Finding{Object: h.Object, Finding: auditchain.Finding{Kind: KindBadObject,
				Seq: h.Checkpoint.First, Last: hl, Detail: "not the object its head names (sha256 " + h.SHA256 + ")"}})
		}
	}
	return rep, nil
}

// readHead reads and checks the head object name: its checkpoint signed
// with key, of the stream and ending at the sequence its name says.
func readHead(ctx context.Context, store archivestore.Store, name string, created time.Time, last uint64, key ed25519.PublicKey) (*Head, error) {
	b, err := store.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	var h Head
	if err := json.Unmarshal(b, &h); err != nil || h.V != 1 || h.Checkpoint == nil {
		return nil, fmt.Errorf("not an archive head (%v)", err)
	}
	if err := h.Checkpoint.CheckHead(key); err != nil {
		return nil, fmt.Errorf("its checkpoint: %w", err)
	}
	at, err := time.Parse(time.RFC3339Nano, h.Checkpoint.StreamCreated)
	r, ok := ParseName(h.Object)
	if err != nil || !at.Equal(created) || h.Checkpoint.Last != last || !ok || !r.Created.Equal(created) || r.Last != last {
		return nil, fmt.Errorf("names %s, with a checkpoint of %d..%d of the stream created %s", h.Object,
			h.Checkpoint.First, h.Checkpoint.Last, h.Checkpoint.StreamCreated)
	}
	h.name = name
	return &h, nil
}

// readObject checks one object, adding its findings to rep, and returns its
// first and last checkpoints.
func readObject(ctx context.Context, store archivestore.Store, r *Range, key ed25519.PublicKey, rep *Report) (first, last *auditchain.Checkpoint, digest string, err error) {
	data, err := store.Get(ctx, r.Name)
	if err != nil {
		return nil, nil, "", err
	}
	sum := sha256.Sum256(data)
	digest = hex.EncodeToString(sum[:])
	f, err := auditchain.ReadFile(bytes.NewReader(data))
	if err != nil {
		return nil, nil, digest, err
	}
	st, _ := f.State(ctx)
	if st.First != r.First || st.Last != r.Last {
		return nil, nil, digest, fmt.Errorf("holds sequences %d..%d", st.First, st.Last)
	}
	v, err := auditchain.Verify(ctx, f, auditchain.Options{Key: key})
	if err != nil {
		return nil, nil, digest, err
	}
	rep.Checkpoints += v.Checkpoints
	rep.Events += v.Events
	for _, x := range v.Findings {
		rep.Findings = append(rep.Findings, Finding{Finding: x, Object: r.Name})
	}
	cps, _ := f.Checkpoints(ctx)
	for _, s := range cps {
		if s.Err != nil || s.Checkpoint.Check(key) != nil {
			continue
		}
		if first == nil {
			first = s.Checkpoint
		}
		last = s.Checkpoint
	}
	if first == nil || first.First != r.First || last.Last != r.Last {
		return first, last, digest, errors.New("its checkpoints do not cover the range its name says")
	}
	return first, last, digest, nil
}

// Find is the object a restore names: an object's name, FIRST-LAST, or one
// sequence (the object holding it, of the latest stream that has one).
func Find(ctx context.Context, store archivestore.Store, spec string) (Range, error) {
	ranges, _, err := Ranges(ctx, store)
	if err != nil {
		return Range{}, err
	}
	var lo, hi uint64
	if a, b, ok := strings.Cut(spec, "-"); ok && !strings.HasPrefix(spec, "AUDIT-") {
		lo, err = strconv.ParseUint(a, 10, 64)
		if err == nil {
			hi, err = strconv.ParseUint(b, 10, 64)
		}
	} else if !strings.HasPrefix(spec, "AUDIT-") {
		lo, err = strconv.ParseUint(spec, 10, 64)
		hi = 0
	}
	if err != nil {
		return Range{}, fmt.Errorf("%q: want an object's name, FIRST-LAST or a sequence", spec)
	}
	for i := len(ranges) - 1; i >= 0; i-- {
		r := ranges[i]
		switch {
		case r.Name == spec,
			hi != 0 && r.First == lo && r.Last == hi,
			hi == 0 && lo != 0 && r.First <= lo && lo <= r.Last:
			return r, nil
		}
	}
	return Range{}, fmt.Errorf("%q: %w", spec, archivestore.ErrNotFound)
}
