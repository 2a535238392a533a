package auditchain

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"
)

// The export format (JSON Lines, docs/audit.md): a header line, then every
// checkpoint of the chain, then the events, each with its inclusion proof
// when a checkpoint covers it. An event's bytes are kept exactly (base64):
// they are what the leaves hash.

// FileVersion is the export format's version.
const FileVersion = 1

// Line kinds.
const (
	lineHeader     = "header"
	lineCheckpoint = "checkpoint"
	lineEvent      = "event"
)

type fileLine struct {
	Kind string `json:"kind"`
	// header
	V             int    `json:"v,omitempty"`
	StreamCreated string `json:"stream_created,omitempty"`
	First         uint64 `json:"first,omitempty"`
	Last          uint64 `json:"last,omitempty"`
	MaxAge        int64  `json:"max_age_ns,omitempty"`
	ChainFirst    uint64 `json:"chain_first,omitempty"`
	Tenant        string `json:"tenant,omitempty"`
	Exists        bool   `json:"exists,omitempty"`
	From          uint64 `json:"from,omitempty"`
	To            uint64 `json:"to,omitempty"`
	// checkpoint and event
	Seq uint64 `json:"seq,omitempty"`
	// Data is a checkpoint message's or an event's bytes.
	Data []byte `json:"data,omitempty"`
	// event
	Subject string     `json:"subject,omitempty"`
	Time    string     `json:"time,omitempty"`
	EventID string     `json:"event_id,omitempty"`
	Proof   *fileProof `json:"proof,omitempty"`
}

type fileProof struct {
	Checkpoint uint64   `json:"checkpoint"`
	Index      uint64   `json:"index"`
	Size       uint64   `json:"size"`
	Path       []string `json:"path"`
}

// ExportOptions select what Export writes.
type ExportOptions struct {
	// From and To bound the AUDIT sequences written (0: no bound).
	From, To uint64
	// Tenant writes only that tenant's events (each with its proof).
	Tenant string
}

// Export writes the trail src holds, as `toolgate audit verify --file`
// reads it, and returns how many events it wrote. Every checkpoint is
// written (the chain is checked whole); events are read a checkpoint's
// range at a time, to compute their proofs.
func Export(ctx context.Context, src Source, w io.Writer, o ExportOptions) (int, error) {
	st, err := src.State(ctx)
	if err != nil {
		return 0, err
	}
	stored, err := src.Checkpoints(ctx)
	if err != nil {
		return 0, err
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	h := fileLine{Kind: lineHeader, V: FileVersion, StreamCreated: st.Created, First: st.First, Last: st.Last,
		MaxAge: int64(st.MaxAge), ChainFirst: st.ChainFirst, Tenant: o.Tenant, Exists: st.Exists, From: o.From, To: o.To}
	if err := enc.Encode(h); err != nil {
		return 0, err
	}
	var current []link
	for _, s := range stored {
		data, _ := json.Marshal(s.Checkpoint)
		if s.Err != nil {
			data = nil
		}
		if err := enc.Encode(fileLine{Kind: lineCheckpoint, Seq: s.Seq, Data: data}); err != nil {
			return 0, err
		}
		if s.Err == nil && s.Checkpoint.StreamCreated == st.Created {
			current = append(current, link{seq: s.Seq, cp: s.Checkpoint})
		}
	}
	inWindow := func(first, last uint64) bool {
		return (o.From == 0 || last >= o.From) && (o.To == 0 || first <= o.To)
	}
	n := 0
	// A checkpoint's events are written whole, even past From or To: a
	// verifier compares the range, and would take the rest as deleted.
	write := func(e Event, proof *fileProof) error {
		if proof == nil && ((o.From != 0 && e.Seq < o.From) || (o.To != 0 && e.Seq > o.To)) {
			return nil
		}
		if o.Tenant != "" && tenantOf(e.Subject) != o.Tenant {
			return nil
		}
		n++
		return enc.Encode(fileLine{Kind: lineEvent, Seq: e.Seq, Subject: e.Subject, Time: e.Time.UTC().Format(time.RFC3339Nano),
			EventID: eventID(e.Data), Data: e.Data, Proof: proof})
	}
	next := st.First
	for _, c := range current {
		if !st.Exists || !inWindow(c.cp.First, c.cp.Last) {
			next = max(next, c.cp.Last+1)
			continue
		}
		var evs []Event
		leaves := make([]Hash, c.cp.Size())
		for i := range leaves {
			leaves[i] = absentLeaf
		}
		err := src.Events(ctx, c.cp.First, c.cp.Last, func(e Event) error {
			if e.Seq >= c.cp.First && e.Seq <= c.cp.Last {
				leaves[e.Seq-c.cp.First] = LeafHash(e.Subject, e.Data)
				evs = append(evs, e)
			}
			return nil
		})
		if err != nil {
			return n, err
		}
		for _, e := range evs {
			i := e.Seq - c.cp.First
			p := &fileProof{Checkpoint: c.seq, Index: i, Size: c.cp.Size(), Path: []string{}}
			for _, h := range InclusionProof(int(i), leaves) {
				p.Path = append(p.Path, hex.EncodeToString(h[:]))
			}
			if err := write(e, p); err != nil {
				return n, err
			}
		}
		next = max(next, c.cp.Last+1)
	}
	if st.Exists && st.Last >= next && inWindow(next, st.Last) {
		err := src.Events(ctx, next, st.Last, func(e Event) error { return write(e, nil) })
		if err != nil {
			return n, err
		}
	}
	return n, bw.Flush()
}

// File is a decoded export: a Source for Verify.
type File struct {
	state  StreamState
	cps    []Stored
	events []Event
}

// Limits of ReadFile: one line (a checkpoint lists up to MaxEvents ids),
// and the lines of a file.
const (
	maxLine  = 8 << 20
	maxLines = 50_000_000
)

// ReadFile decodes an export written by Export. It checks the format, not
// the contents: Verify does that.
func ReadFile(r io.Reader) (*File, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	f := &File{}
	lines := 0
	var lastCP, lastEv uint64
	for sc.Scan() {
		lines++
		if lines > maxLines {
			return nil, fmt.Errorf("line %d: too many lines", lines)
		}
		var l fileLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("line %d: %w", lines, err)
		}
		if (lines == 1) != (l.Kind == lineHeader) {
			return nil, fmt.Errorf("line %d: the header must be the first line, and only it", lines)
		}
		switch l.Kind {
		case lineHeader:
			if l.V != FileVersion {
				return nil, fmt.Errorf("line 1: export format version %d, want %d", l.V, FileVersion)
			}
			if l.MaxAge < 0 {
				return nil, fmt.Errorf("line 1: negative max age")
			}
			f.state = StreamState{Exists: l.Exists, Created: l.StreamCreated, First: l.First, Last: l.Last,
				MaxAge: time.Duration(l.MaxAge), ChainFirst: l.ChainFirst, Tenant: l.Tenant, From: l.From, To: l.To}
		case lineCheckpoint:
			if l.Seq <= lastCP || len(f.events) > 0 {
				return nil, fmt.Errorf("line %d: checkpoint %d out of order", lines, l.Seq)
			}
			lastCP = l.Seq
			s := Stored{Seq: l.Seq}
			if s.Checkpoint, s.Err = DecodeCheckpoint(l.Data); s.Err != nil {
				s.Checkpoint = nil
			}
			f.cps = append(f.cps, s)
		case lineEvent:
			if l.Seq <= lastEv {
				return nil, fmt.Errorf("line %d: event %d out of order", lines, l.Seq)
			}
			lastEv = l.Seq
			t, err := time.Parse(time.RFC3339Nano, l.Time)
			if err != nil {
				return nil, fmt.Errorf("line %d: time: %w", lines, err)
			}
			e := Event{Seq: l.Seq, Subject: l.Subject, Data: l.Data, Time: t}
			if l.Proof != nil {
				if len(l.Proof.Path) > 64 {
					return nil, fmt.Errorf("line %d: proof too long", lines)
				}
				e.Proof = make([]Hash, len(l.Proof.Path))
				for i, p := range l.Proof.Path {
					b, err := hex.DecodeString(p)
					if err != nil || len(b) != len(Hash{}) {
						return nil, fmt.Errorf("line %d: proof hash %d", lines, i)
					}
					copy(e.Proof[i][:], b)
				}
			}
			f.events = append(f.events, e)
		default:
			return nil, fmt.Errorf("line %d: unknown kind %q", lines, l.Kind)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", lines+1, err)
	}
	if lines == 0 {
		return nil, fmt.Errorf("empty export")
	}
	return f, nil
}

// State implements Source.
func (f *File) State(context.Context) (StreamState, error) { return f.state, nil }

// Checkpoints implements Source.
func (f *File) Checkpoints(context.Context) ([]Stored, error) { return f.cps, nil }

// Events implements Source.
func (f *File) Events(_ context.Context, first, last uint64, fn func(Event) error) error {
	i := sort.Search(len(f.events), func(i int) bool { return f.events[i].Seq >= first })
	for ; i < len(f.events) && f.events[i].Seq <= last; i++ {
		if err := fn(f.events[i]); err != nil {
			return err
		}
	}
	return nil
}
