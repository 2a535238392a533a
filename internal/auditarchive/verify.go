package auditarchive

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	// An object whose name is not a range's.
	KindStray = "stray-object"
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
// sequence follow that object's last.
func VerifyArchive(ctx context.Context, store archivestore.Store, key ed25519.PublicKey) (*Report, error) {
	ranges, others, err := Ranges(ctx, store)
	if err != nil {
		return nil, err
	}
	rep := &Report{Ranges: ranges}
	for _, o := range others {
		rep.Findings = append(rep.Findings, Finding{Object: o.Name,
			Finding: auditchain.Finding{Kind: KindStray, Detail: "not an archived range's name"}})
	}
	var prev *Range
	var prevLast *auditchain.Checkpoint
	for i := range ranges {
		r := &ranges[i]
		rep.Objects++
		bad := func(detail string) {
			rep.Findings = append(rep.Findings, Finding{Object: r.Name,
				Finding: auditchain.Finding{Kind: KindBadObject, Seq: r.First, Last: r.Last, Detail: detail}})
		}
		first, last, err := readObject(ctx, store, r, key, rep)
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
	return rep, nil
}

// readObject checks one object, adding its findings to rep, and returns its
// first and last checkpoints.
func readObject(ctx context.Context, store archivestore.Store, r *Range, key ed25519.PublicKey, rep *Report) (first, last *auditchain.Checkpoint, err error) {
	data, err := store.Get(ctx, r.Name)
	if err != nil {
		return nil, nil, err
	}
	f, err := auditchain.ReadFile(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	st, _ := f.State(ctx)
	if st.First != r.First || st.Last != r.Last {
		return nil, nil, fmt.Errorf("holds sequences %d..%d", st.First, st.Last)
	}
	v, err := auditchain.Verify(ctx, f, auditchain.Options{Key: key})
	if err != nil {
		return nil, nil, err
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
		return first, last, errors.New("its checkpoints do not cover the range its name says")
	}
	return first, last, nil
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
