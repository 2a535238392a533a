package kvstore

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// Checkpoints live in one bucket (docs/checkpoints.md): per checkpoint a
// small description under m.<tenant>.<invocation>.<seq> and its stored
// bytes in chunks under s.<tenant>.<invocation>.<seq>.<n>. Values of a
// bucket are bounded by the server's largest message (1 MiB by default),
// so a large state is cut into chunks; the Object Store would do the same
// chunking but keeps no per-object TTL, which the three kinds need.
const (
	chunkBytes = 512 << 10
	// DefaultMicroTTL is how long a micro checkpoint can be resumed.
	DefaultMicroTTL = time.Hour
	// DefaultMacroRetention is how long a macro checkpoint is kept.
	DefaultMacroRetention = 90 * 24 * time.Hour
	// macroSlack is how much longer than its retention a macro
	// checkpoint's bytes stay, so later deltas of it can still be read.
	macroSlack = 7 * 24 * time.Hour
	// expiredGrace is how long a description outlives its checkpoint's
	// bytes, so a resume of it is told it expired (E3707) rather than
	// that it never existed (E3702).
	expiredGrace = 24 * time.Hour
)

// CheckpointParent is what a run keeps of its last checkpoint of a kind,
// so that the next one can be stored as a delta of it without reading it
// back.
type CheckpointParent struct {
	Meta  api.Checkpoint
	State json.RawMessage
}

func checkpointErr(cause error, code api.Code, ecode, format string, args ...any) *api.Error {
	if cause == nil {
		return api.NewError(code, ecode, format, args...)
	}
	return api.WrapError(cause, code, ecode, format, args...)
}

// CheckpointID is the id of checkpoint seq of an invocation.
func CheckpointID(invocation string, seq int) string {
	return "cp-" + strconv.Itoa(seq) + "-" + invocation
}

// ParseCheckpointID returns the invocation and sequence a checkpoint id
// names.
func ParseCheckpointID(id string) (invocation string, seq int, err error) {
	rest, ok := strings.CutPrefix(id, "cp-")
	n, inv, ok2 := strings.Cut(rest, "-")
	seq, err = strconv.Atoi(n)
	if !ok || !ok2 || err != nil || seq < 1 || strconv.Itoa(seq) != n || subjects.CheckID(inv) != nil {
		return "", 0, checkpointErr(nil, api.ResumeFailed, api.ECheckpointNotFound, "%q is not a checkpoint id (cp-<seq>-<invocation id>)", id)
	}
	return inv, seq, nil
}

func cpMetaKey(tenant, inv string, seq int) string {
	return "m." + invocationKey(tenant, inv) + "." + strconv.Itoa(seq)
}

func cpChunkKey(tenant, inv string, seq, n int) string {
	return "s." + invocationKey(tenant, inv) + "." + strconv.Itoa(seq) + "." + strconv.Itoa(n)
}

func (s *Store) now() time.Time {
	if s.clock != nil {
		return s.clock().UTC()
	}
	return time.Now().UTC()
}

// lifetimes returns how long checkpoints of kind can be resumed (0: until
// deleted) and how long their bytes are kept, which is longer for kinds
// whose checkpoints may be deltas of earlier ones.
func (s *Store) lifetimes(kind string) (resumable, kept time.Duration) {
	switch kind {
	case api.CheckpointMicro:
		return s.microTTL, 2 * s.microTTL
	case api.CheckpointMacro:
		return s.macroRetention, s.macroRetention + macroSlack
	}
	return 0, 0
}

// SaveCheckpoint stores a checkpoint of cp.Kind for cp.Tenant's invocation
// cp.InvocationID, number cp.Seq, and returns its description. state is
// stored compacted, as a merge patch against parent when it is over 100
// KiB and a patch pays, and compressed (zstd) when what is stored is over
// 10 KiB. parent, when set, must be the checkpoint named cp.Parent.
func (s *Store) SaveCheckpoint(ctx context.Context, cp api.Checkpoint, state json.RawMessage, parent *CheckpointParent) (api.Checkpoint, error) {
	if !api.CheckpointKindValid(cp.Kind) {
		return cp, checkpointErr(nil, api.CheckpointFailed, api.ECheckpointCreate, "unknown checkpoint kind %q", cp.Kind)
	}
	if len(state) > maxCheckpointBytes {
		return cp, checkpointErr(nil, api.CheckpointFailed, api.ECheckpointCreate,
			"a checkpoint of %d bytes is over the %d byte limit", len(state), maxCheckpointBytes)
	}
	state, err := compactState(state)
	if err != nil {
		return cp, checkpointErr(err, api.CheckpointFailed, api.ECheckpointCreate, "checkpoint state is not JSON: %v", err)
	}
	now := s.now()
	cp.ID = CheckpointID(cp.InvocationID, cp.Seq)
	cp.CreatedAt, cp.StateBytes, cp.Delta, cp.Depth, cp.Base, cp.Expired = now, len(state), false, 0, now, false
	resumable, kept := s.lifetimes(cp.Kind)
	cp.ExpiresAt = time.Time{}
	if resumable > 0 {
		cp.ExpiresAt = now.Add(resumable)
	}
	stored := []byte(state)
	if parent != nil && s.deltaAllowed(cp, parent, now, kept-resumable) {
		if patch, ok := makeDelta(parent.State, state); ok {
			stored, cp.Delta, cp.Depth, cp.Base = patch, true, parent.Meta.Depth+1, parent.Meta.Base
		}
	}
	cp.Encoding = encJSON
	if len(stored) > compressAbove {
		z, err := compressState(stored)
		if err != nil {
			return cp, checkpointErr(err, api.CheckpointFailed, api.ECheckpointCompression, "compressing a checkpoint: %v", err)
		}
		stored, cp.Encoding = z, encZstd
	}
	cp.StoredBytes = len(stored)
	sum := sha256.Sum256(stored)
	cp.StoredDigest, cp.Sig = hex.EncodeToString(sum[:]), ""
	cp.Chunks = max(1, (len(stored)+chunkBytes-1)/chunkBytes)
	var chunkOpts, metaOpts []jetstream.KVCreateOpt
	if kept > 0 {
		chunkOpts = []jetstream.KVCreateOpt{jetstream.KeyTTL(kept)}
		metaOpts = []jetstream.KVCreateOpt{jetstream.KeyTTL(kept + expiredGrace)}
	}
	// The chunks go first: a description is there only for a whole state.
	for n := range cp.Chunks {
		chunk := stored[n*chunkBytes : min(len(stored), (n+1)*chunkBytes)]
		if _, err := s.checkpoints.Create(ctx, cpChunkKey(cp.Tenant, cp.InvocationID, cp.Seq, n), chunk, chunkOpts...); err != nil {
			return cp, createErr(cp, err)
		}
	}
	desc, err := json.Marshal(cp)
	if err == nil && s.signCheckpoint != nil {
		cp.Sig = s.signCheckpoint(desc)
		desc, err = json.Marshal(cp)
	}
	if err != nil {
		return cp, checkpointErr(err, api.CheckpointFailed, api.ECheckpointCreate, "%v", err)
	}
	if _, err := s.checkpoints.Create(ctx, cpMetaKey(cp.Tenant, cp.InvocationID, cp.Seq), desc, metaOpts...); err != nil {
		return cp, createErr(cp, err)
	}
	return cp, nil
}

func createErr(cp api.Checkpoint, err error) error {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return checkpointErr(err, api.StateConflict, api.ECheckpointConflict,
			"checkpoint %s was written by another run of invocation %s", cp.ID, cp.InvocationID)
	}
	return checkpointErr(err, api.CheckpointFailed, api.ECheckpointCreate, "storing checkpoint %s: %v", cp.ID, err).AsRetryable()
}

// deltaAllowed: a delta is taken of the run's previous checkpoint of the
// same kind, never of a named one (deleting it would break the chain),
// within a bounded depth, and only while every link of the chain stays
// stored until the new checkpoint expires: the chain's whole state (its
// base) must be younger than the slack its bytes are kept beyond their
// kind's lifetime.
func (s *Store) deltaAllowed(cp api.Checkpoint, p *CheckpointParent, now time.Time, slack time.Duration) bool {
	return cp.StateBytes > deltaAbove && cp.Kind != api.CheckpointNamed &&
		p.Meta.ID == cp.Parent && p.Meta.Kind == cp.Kind && p.Meta.InvocationID == cp.InvocationID &&
		p.Meta.Tenant == cp.Tenant && p.Meta.Depth < maxDeltaDepth && now.Sub(p.Meta.Base) < slack
}

// CheckpointMeta returns the description of checkpoint id of tenant
// (E3702 when there is none), with Expired set when its time has passed.
func (s *Store) CheckpointMeta(ctx context.Context, tenant, id string) (api.Checkpoint, error) {
	inv, seq, err := ParseCheckpointID(id)
	if err != nil {
		return api.Checkpoint{}, err
	}
	return s.checkpointMeta(ctx, tenant, inv, seq, id)
}

func (s *Store) checkpointMeta(ctx context.Context, tenant, inv string, seq int, id string) (api.Checkpoint, error) {
	e, err := s.checkpoints.Get(ctx, cpMetaKey(tenant, inv, seq))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return api.Checkpoint{}, checkpointErr(nil, api.ResumeFailed, api.ECheckpointNotFound, "no checkpoint %s in tenant %s", id, tenant)
	}
	if err != nil {
		return api.Checkpoint{}, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "reading checkpoint %s: %v", id, err).AsRetryable()
	}
	var cp api.Checkpoint
	if err := json.Unmarshal(e.Value(), &cp); err != nil || cp.ID != id || cp.Tenant != tenant {
		return api.Checkpoint{}, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s has a corrupt description", id)
	}
	if err := s.checkSigned(cp, inv, seq); err != nil {
		return api.Checkpoint{}, err
	}
	cp.Expired = !cp.ExpiresAt.IsZero() && !s.now().Before(cp.ExpiresAt)
	return cp, nil
}

// SignCheckpoints has the store sign each checkpoint it saves with sign
// and resume only from those check accepts (execute's key: any role that
// may delete checkpoints may also write the bucket). Set it before the
// store is used.
func (s *Store) SignCheckpoints(sign func(desc []byte) string, check func(desc []byte, sig string) bool) {
	s.signCheckpoint, s.checkpointSigned = sign, check
}

// checkSigned refuses (E3236) a description read under the key of
// invocation inv, number seq, that execute did not sign, or signed for
// another key: one call's checkpoint moved under another's name.
func (s *Store) checkSigned(cp api.Checkpoint, inv string, seq int) error {
	if s.checkpointSigned == nil {
		return nil
	}
	if cp.InvocationID != inv || cp.Seq != seq {
		return checkpointErr(nil, api.ResumeFailed, api.ECheckpointUnsigned,
			"checkpoint %s is stored under invocation %s number %d, not its own", cp.ID, inv, seq)
	}
	sig := cp.Sig
	cp.Sig, cp.Expired = "", false
	desc, err := json.Marshal(cp)
	if err != nil || !s.checkpointSigned(desc, sig) {
		return checkpointErr(err, api.ResumeFailed, api.ECheckpointUnsigned,
			"checkpoint %s is not signed by the execute stage: written into the bucket by another role, or altered", cp.ID)
	}
	return nil
}

// LoadCheckpoint returns checkpoint id of tenant and the state it holds:
// E3702 when there is none, E3707 when its time has passed, E3703, E3705
// or E3706 when its data cannot be read back.
func (s *Store) LoadCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, json.RawMessage, error) {
	cp, err := s.CheckpointMeta(ctx, tenant, id)
	if err != nil {
		return cp, nil, err
	}
	if cp.Expired {
		return cp, nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointExpired,
			"checkpoint %s (%s) expired at %s", id, cp.Kind, cp.ExpiresAt.Format(time.RFC3339))
	}
	state, err := s.restore(ctx, cp)
	return cp, state, err
}

// restore reads a checkpoint's state, applying its chain of deltas.
func (s *Store) restore(ctx context.Context, cp api.Checkpoint) (json.RawMessage, error) {
	if cp.Chunks < 1 || cp.Chunks > maxCheckpointBytes/chunkBytes+2 {
		return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s has a corrupt description", cp.ID)
	}
	stored := make([]byte, 0, cp.StoredBytes)
	for n := range cp.Chunks {
		e, err := s.checkpoints.Get(ctx, cpChunkKey(cp.Tenant, cp.InvocationID, cp.Seq, n))
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s has lost part %d of its data", cp.ID, n)
			}
			return nil, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "reading checkpoint %s: %v", cp.ID, err).AsRetryable()
		}
		stored = append(stored, e.Value()...)
	}
	if len(stored) != cp.StoredBytes {
		return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s holds %d bytes, not %d", cp.ID, len(stored), cp.StoredBytes)
	}
	if s.checkpointSigned != nil {
		// The signed description names the bytes; chunks are plain keys.
		if sum := sha256.Sum256(stored); hex.EncodeToString(sum[:]) != cp.StoredDigest {
			return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointUnsigned,
				"checkpoint %s holds other bytes than execute stored: replaced by another role", cp.ID)
		}
	}
	switch cp.Encoding {
	case encJSON:
	case encZstd:
		var err error
		if stored, err = decompressState(stored); err != nil {
			return nil, checkpointErr(err, api.CheckpointFailed, api.ECheckpointCompression, "decompressing checkpoint %s: %v", cp.ID, err)
		}
	default:
		return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s has an unknown encoding %q", cp.ID, cp.Encoding)
	}
	if cp.Delta {
		if cp.Depth < 1 || cp.Depth > maxDeltaDepth || cp.Parent == "" {
			return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s has a corrupt description", cp.ID)
		}
		inv, seq, err := ParseCheckpointID(cp.Parent)
		if err != nil || inv != cp.InvocationID || seq >= cp.Seq {
			return nil, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s names a parent it cannot have", cp.ID)
		}
		pm, err := s.checkpointMeta(ctx, cp.Tenant, inv, seq, cp.Parent)
		if err != nil {
			return nil, checkpointErr(err, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s is a delta of %s, which cannot be read: %v", cp.ID, cp.Parent, err)
		}
		if pm.Depth != cp.Depth-1 {
			return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s and its parent disagree on the chain", cp.ID)
		}
		base, err := s.restore(ctx, pm)
		if err != nil {
			return nil, err
		}
		if stored, err = applyDelta(base, stored); err != nil {
			return nil, checkpointErr(err, api.ResumeFailed, api.ECheckpointDelta, "applying checkpoint %s to its parent %s: %v", cp.ID, cp.Parent, err)
		}
	}
	if len(stored) != cp.StateBytes || !json.Valid(stored) {
		return nil, checkpointErr(nil, api.ResumeFailed, api.ECheckpointRestore, "checkpoint %s does not restore the state it saved", cp.ID)
	}
	return stored, nil
}

// LatestCheckpoint returns the newest checkpoint of an invocation that can
// still be resumed (ok false when there is none), and the highest sequence
// any checkpoint of it used, resumable or not, so that a later run numbers
// its own after it.
func (s *Store) LatestCheckpoint(ctx context.Context, tenant, inv string) (cp api.Checkpoint, ok bool, maxSeq int, err error) {
	keys, err := s.keys(ctx, s.checkpoints, "*."+invocationKey(tenant, inv)+".>")
	if err != nil {
		return cp, false, 0, err
	}
	var seqs []int
	for _, k := range keys {
		parts := strings.Split(k, ".")
		if len(parts) < 4 {
			continue
		}
		if n, err := strconv.Atoi(parts[3]); err == nil {
			maxSeq = max(maxSeq, n)
			if parts[0] == "m" {
				seqs = append(seqs, n)
			}
		}
	}
	slices.Sort(seqs)
	for _, seq := range slices.Backward(seqs) {
		m, err := s.checkpointMeta(ctx, tenant, inv, seq, CheckpointID(inv, seq))
		if errors.Is(err, &api.Error{Code: api.ResumeFailed, ECode: api.ECheckpointNotFound}) {
			continue
		}
		if err != nil {
			return cp, false, maxSeq, err
		}
		if !m.Expired {
			return m, true, maxSeq, nil
		}
	}
	return cp, false, maxSeq, nil
}

// maxListed bounds a listing; the newest are kept.
const maxListed = 1000

// ListCheckpoints returns the checkpoints of tenant's invocation inv, or of
// the whole tenant when inv is empty, oldest first (at most the newest
// 1000).
func (s *Store) ListCheckpoints(ctx context.Context, tenant, inv string) ([]api.Checkpoint, error) {
	pattern := "m." + subjects.Token(tenant) + ".*.*"
	if inv != "" {
		pattern = "m." + invocationKey(tenant, inv) + ".*"
	}
	keys, err := s.keys(ctx, s.checkpoints, pattern)
	if err != nil {
		return nil, err
	}
	out := make([]api.Checkpoint, 0, len(keys))
	for _, k := range keys {
		e, err := s.checkpoints.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var cp api.Checkpoint
		if json.Unmarshal(e.Value(), &cp) != nil || cp.Tenant != tenant {
			continue
		}
		cp.Expired = !cp.ExpiresAt.IsZero() && !s.now().Before(cp.ExpiresAt)
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b api.Checkpoint) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.InvocationID, b.InvocationID), cmp.Compare(a.Seq, b.Seq))
	})
	if len(out) > maxListed {
		out = out[len(out)-maxListed:]
	}
	return out, nil
}

// DeleteCheckpoint removes checkpoint id of tenant. A checkpoint that a
// later one is stored as a delta of is refused (E3704, details.dependents):
// deleting it would leave that one unreadable.
func (s *Store) DeleteCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, error) {
	cp, err := s.CheckpointMeta(ctx, tenant, id)
	if err != nil {
		return cp, err
	}
	siblings, err := s.ListCheckpoints(ctx, tenant, cp.InvocationID)
	if err != nil {
		return cp, err
	}
	var dependents []string
	for _, o := range siblings {
		if o.Delta && o.Parent == id && !o.Expired {
			dependents = append(dependents, o.ID)
		}
	}
	if len(dependents) > 0 {
		e := checkpointErr(nil, api.StateConflict, api.ECheckpointConflict,
			"checkpoint %s is the parent of %s, stored as deltas of it: delete those first", id, strings.Join(dependents, ", "))
		return cp, e.WithDetail("dependents", dependents)
	}
	// The description goes first: without it the chunks are never read.
	if err := s.purgeCheckpointKey(ctx, cpMetaKey(tenant, cp.InvocationID, cp.Seq)); err != nil {
		return cp, err
	}
	for n := range cp.Chunks {
		if err := s.purgeCheckpointKey(ctx, cpChunkKey(tenant, cp.InvocationID, cp.Seq, n)); err != nil {
			return cp, err
		}
	}
	return cp, nil
}

// purgeCheckpointKey removes a key and, after a minute, its marker.
func (s *Store) purgeCheckpointKey(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.checkpoints.Purge(ctx, key, jetstream.PurgeTTL(time.Minute)); err != nil {
		return fmt.Errorf("deleting checkpoint key: %w", err)
	}
	return nil
}
