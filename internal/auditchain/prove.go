package auditchain

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
)

// Proof is an RFC 9162 inclusion proof of one audit event in a signed
// checkpoint: all anyone needs, with the public key, to check that the
// event's bytes are the ones the audit role signed over.
type Proof struct {
	EventID string `json:"event_id"`
	Seq     uint64 `json:"seq"`
	Subject string `json:"subject"`
	// Data is the event's bytes; LeafHash SHA-256(0x00 || subject ||
	// "\n" || data), hex.
	Data     []byte `json:"data"`
	LeafHash string `json:"leaf_hash"`
	// Index is the leaf's place in the checkpoint's tree of TreeSize
	// leaves (Seq - First), Path its audit path, leaf side up.
	Index      uint64      `json:"leaf_index"`
	TreeSize   uint64      `json:"tree_size"`
	Path       []string    `json:"inclusion_path"`
	Checkpoint *Checkpoint `json:"checkpoint"`
	// CheckpointSeq is the checkpoint's sequence in AUDIT_CHAIN.
	CheckpointSeq uint64 `json:"checkpoint_seq"`
}

// ErrNotCovered is returned for an event no checkpoint covers yet.
var ErrNotCovered = errors.New("no checkpoint covers the event yet")

// ErrForeign is returned for an event its checkpoint says no audit
// process wrote: it is in the trail, but not audit's.
var ErrForeign = errors.New("its checkpoint says no audit process wrote the event")

// Prove finds event id in the checkpoints src holds (the last one that
// lists it) and returns its inclusion proof, checked.
func Prove(ctx context.Context, src Source, id string, pub ed25519.PublicKey) (*Proof, error) {
	stored, err := src.Checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	var foreign uint64
	for k := len(stored) - 1; k >= 0; k-- {
		s := stored[k]
		if s.Err != nil {
			continue
		}
		cp := s.Checkpoint
		for i, got := range cp.IDs {
			if got != id {
				continue
			}
			if slices.Contains(cp.Foreign, cp.First+uint64(i)) {
				// A copy or a forgery under the id: prove audit's event, if any.
				foreign = cp.First + uint64(i)
				continue
			}
			leaves := make([]Hash, cp.Size())
			for j := range leaves {
				leaves[j] = absentLeaf
			}
			var ev *Event
			err := src.Events(ctx, cp.First, cp.Last, func(e Event) error {
				if e.Seq >= cp.First && e.Seq <= cp.Last {
					leaves[e.Seq-cp.First] = LeafHash(e.Subject, e.Data)
					if e.Seq == cp.First+uint64(i) {
						ev = &e
					}
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			if ev == nil {
				return nil, fmt.Errorf("event %s (seq %d) is checkpointed but no longer stored", id, cp.First+uint64(i))
			}
			p := &Proof{EventID: id, Seq: ev.Seq, Subject: ev.Subject, Data: ev.Data, Index: uint64(i), TreeSize: cp.Size(),
				Checkpoint: cp, CheckpointSeq: s.Seq, Path: []string{}}
			leaf := leaves[i]
			p.LeafHash = hex.EncodeToString(leaf[:])
			for _, h := range InclusionProof(i, leaves) {
				p.Path = append(p.Path, hex.EncodeToString(h[:]))
			}
			if err := p.Check(pub); err != nil {
				return p, err
			}
			return p, nil
		}
	}
	if foreign != 0 {
		return nil, fmt.Errorf("event %s at seq %d: %w", id, foreign, ErrForeign)
	}
	return nil, fmt.Errorf("event %s: %w", id, ErrNotCovered)
}

// Check verifies the proof: the checkpoint's signature with pub, and the
// event's bytes leading along the path to its root.
func (p *Proof) Check(pub ed25519.PublicKey) error {
	if p.Checkpoint == nil {
		return ErrMalformed
	}
	if err := p.Checkpoint.CheckHead(pub); err != nil {
		return err
	}
	root, _ := p.Checkpoint.root()
	path := make([]Hash, len(p.Path))
	for i, s := range p.Path {
		b, err := hex.DecodeString(s)
		if err != nil || len(b) != len(Hash{}) {
			return ErrProof
		}
		copy(path[i][:], b)
	}
	if p.Seq != p.Checkpoint.First+p.Index || p.TreeSize != p.Checkpoint.Size() {
		return ErrProof
	}
	if err := VerifyInclusion(LeafHash(p.Subject, p.Data), p.Index, p.TreeSize, path, root); err != nil {
		return err
	}
	if slices.Contains(p.Checkpoint.Foreign, p.Seq) {
		return fmt.Errorf("event %s at seq %d: %w", p.EventID, p.Seq, ErrForeign)
	}
	return nil
}
