package kvstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tooldesc"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/subjects"
)

func toolKey(id, version string) string { return subjects.Token(id) + "." + subjects.Token(version) }

func parseToolKey(key string) (id, version string, err error) {
	a, b, ok := strings.Cut(key, ".")
	if !ok {
		return "", "", fmt.Errorf("malformed tool key %q", key)
	}
	if id, err = subjects.Untoken(a); err != nil {
		return "", "", err
	}
	version, err = subjects.Untoken(b)
	return id, version, err
}

// RegisterTool validates doc as a tool manifest and stores it. Registering an
// id and version that exist fails with duplicate (E3007) unless replace is set.
// The stored manifest has lifecycle.updated_at set to now, and
// lifecycle.created_at, when the document has none, to the replaced
// version's or now.
func (s *Store) RegisterTool(ctx context.Context, doc []byte, replace bool) (*tools.Manifest, error) {
	return s.RegisterSignedTool(ctx, doc, replace, "", nil)
}

// ToolRecord is a stored tool manifest with the operator's signed register
// request that made it. Readers on an authenticated bus honour no manifest
// without one (internal/signedstate). A bare manifest (a value without a
// "manifest" member) is read as an unsigned record.
type ToolRecord struct {
	Manifest     json.RawMessage    `json:"manifest"`
	RegisteredBy string             `json:"registered_by,omitempty"`
	Proof        *api.DecisionProof `json:"proof,omitempty"`
	// Removal, when set, is the operator's delete of this version: the
	// manifest stays as registered (and signed), and readers serve it
	// with lifecycle state removed.
	Removal *ToolRemoval `json:"removal,omitempty"`
	// Pending is a change of an imported tool held until an operator
	// accepts it: readers serve Manifest, never this.
	Pending *ToolPending `json:"pending,omitempty"`
}

// ToolPending is a manifest an operator's replace sent whose server now
// lists the tool otherwise than the pinned manifest's digest says, with
// that signed request, kept for AcceptToolChange.
type ToolPending struct {
	Manifest     json.RawMessage    `json:"manifest"`
	Digest       string             `json:"digest"`
	RegisteredBy string             `json:"registered_by,omitempty"`
	Proof        *api.DecisionProof `json:"proof,omitempty"`
	At           time.Time          `json:"at"`
}

// ToolRemoval records who removed a tool version and when, with the signed
// delete request on an authenticated bus.
type ToolRemoval struct {
	By    string             `json:"by,omitempty"`
	At    time.Time          `json:"at"`
	Proof *api.DecisionProof `json:"proof,omitempty"`
}

// ParseToolRecord decodes the manifest of a stored tool record; a removed
// version's lifecycle says it is removed, when and by whom.
func ParseToolRecord(rec ToolRecord) (*tools.Manifest, error) {
	m, err := tools.Parse(rec.Manifest)
	if err != nil || rec.Removal == nil {
		return m, err
	}
	m.Lifecycle.State = tools.StateRemoved
	m.Lifecycle.RemovedAt, m.Lifecycle.RemovedBy = rec.Removal.At, rec.Removal.By
	return m, nil
}

// decodeToolRecord reads a stored tool value.
func decodeToolRecord(val []byte) ToolRecord {
	var r ToolRecord
	if json.Unmarshal(val, &r) == nil && len(r.Manifest) > 0 {
		return r
	}
	return ToolRecord{Manifest: val}
}

// RegisterSignedTool is RegisterTool keeping the signed request proof
// (made by the operator by) in the stored record.
func (s *Store) RegisterSignedTool(ctx context.Context, doc []byte, replace bool, by string, proof *api.DecisionProof) (*tools.Manifest, error) {
	m, err := tools.Parse(doc)
	if err != nil {
		return nil, err
	}
	// The registry keeps toolgate's own form, whichever the operator wrote.
	if doc, err = tools.Native(doc); err != nil {
		return nil, err
	}
	key := toolKey(m.ID, m.Version)
	created := m.Lifecycle.CreatedAt
	// A change held for the version outlives a replace that is not it (a
	// lifecycle move); one that stores it (its accept) ends it.
	var pending *ToolPending
	if replace {
		if e, err := s.tools.Get(ctx, key); err == nil {
			rec := decodeToolRecord(e.Value())
			if old, err := tools.Parse(rec.Manifest); err == nil && created.IsZero() {
				created = old.Lifecycle.CreatedAt
			}
			if rec.Pending != nil && rec.Pending.Digest != tooldesc.Pinned(doc) {
				pending = rec.Pending
			}
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	if doc, err = stampLifecycle(doc, cmp.Or(created, now), now); err != nil {
		return nil, err
	}
	if m, err = tools.Parse(doc); err != nil {
		return nil, err
	}
	val := doc
	if proof != nil || pending != nil {
		if val, err = json.Marshal(ToolRecord{Manifest: doc, RegisteredBy: by, Proof: proof, Pending: pending}); err != nil {
			return nil, err
		}
	}
	if replace {
		_, err = s.tools.Put(ctx, key, val)
	} else {
		_, err = s.tools.Create(ctx, key, val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, api.NewError(api.InvalidParameters, api.EDuplicateTool,
				"tool %s version %s is already registered", m.ID, m.Version)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("storing tool %s: %w", m.Key(), err)
	}
	return m, nil
}

// StampLifecycle is stampLifecycle for readers that compare a stored
// manifest with the one an operator signed.
func StampLifecycle(doc []byte, created, updated time.Time) ([]byte, error) {
	return stampLifecycle(doc, created, updated)
}

// stampLifecycle sets lifecycle.created_at and updated_at in a manifest
// document, keeping every other member (numbers included) as it was.
func stampLifecycle(doc []byte, created, updated time.Time) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		return nil, err
	}
	var l map[string]json.RawMessage
	if raw, ok := m["lifecycle"]; ok {
		if err := json.Unmarshal(raw, &l); err != nil {
			return nil, err
		}
	}
	if l == nil {
		l = map[string]json.RawMessage{}
	}
	l["created_at"], _ = json.Marshal(created.UTC().Format(time.RFC3339))
	l["updated_at"], _ = json.Marshal(updated.UTC().Format(time.RFC3339))
	var err error
	if m["lifecycle"], err = json.Marshal(l); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// RemoveTool marks one version of a tool removed, keeping its manifest for
// the record, by compare-and-swap on the stored record. It returns the
// version as readers now see it; a version already removed is left as it
// was.
func (s *Store) RemoveTool(ctx context.Context, id, version string, r ToolRemoval) (*tools.Manifest, error) {
	key := toolKey(id, version)
	for range casAttempts {
		e, err := s.tools.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, api.NewError(api.ToolNotFound, api.EToolNotFound, "no tool %s version %s", id, version)
		}
		if err != nil {
			return nil, err
		}
		rec := decodeToolRecord(e.Value())
		if rec.Removal != nil {
			return ParseToolRecord(rec)
		}
		rec.Removal = &r
		val, err := json.Marshal(rec)
		if err != nil {
			return nil, err
		}
		_, err = s.tools.Update(ctx, key, val, e.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // replaced meanwhile: remove what is there now
		}
		if err != nil {
			return nil, fmt.Errorf("removing tool %s@%s: %w", id, version, err)
		}
		return ParseToolRecord(rec)
	}
	return nil, fmt.Errorf("removing tool %s@%s: %w", id, version, ErrContention)
}

// Tool is the stored record of one version of a tool.
func (s *Store) Tool(ctx context.Context, id, version string) (ToolRecord, error) {
	e, err := s.tools.Get(ctx, toolKey(id, version))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ToolRecord{}, api.NewError(api.ToolNotFound, api.EToolNotFound, "no tool %s version %s", id, version)
	}
	if err != nil {
		return ToolRecord{}, err
	}
	return decodeToolRecord(e.Value()), nil
}

// HoldToolChange keeps p beside the stored manifest of id@version, which
// readers go on serving, replacing any change held before.
func (s *Store) HoldToolChange(ctx context.Context, id, version string, p ToolPending) error {
	var err error
	if p.Manifest, err = tools.Native(p.Manifest); err != nil {
		return err
	}
	return s.updateTool(ctx, id, version, func(rec *ToolRecord) error {
		rec.Pending = &p
		return nil
	})
}

// updateTool changes the stored record of id@version by compare-and-swap.
func (s *Store) updateTool(ctx context.Context, id, version string, change func(*ToolRecord) error) error {
	key := toolKey(id, version)
	for range casAttempts {
		e, err := s.tools.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return api.NewError(api.ToolNotFound, api.EToolNotFound, "no tool %s version %s", id, version)
		}
		if err != nil {
			return err
		}
		rec := decodeToolRecord(e.Value())
		if err := change(&rec); err != nil {
			return err
		}
		val, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		_, err = s.tools.Update(ctx, key, val, e.Revision())
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return fmt.Errorf("updating tool %s@%s: %w", id, version, err)
		}
		return nil
	}
	return fmt.Errorf("updating tool %s@%s: %w", id, version, ErrContention)
}

// PurgeTool deletes one version of a tool for good, with its history in
// the bucket.
func (s *Store) PurgeTool(ctx context.Context, id, version string) error {
	return s.tools.Purge(ctx, toolKey(id, version))
}

// WatchTools keeps reg equal to the tools bucket until ctx is done. It
// returns once reg holds every manifest stored at the time of the call, so a
// worker never serves with a half-loaded registry.
func (s *Store) WatchTools(ctx context.Context, reg *tools.Registry, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	return s.watch(ctx, s.tools, func(e jetstream.KeyValueEntry) { s.apply(reg, e, log) })
}

// CheckTool judges a stored tool record before a reader honours it: a
// non-nil error ignores the record (the reader keeps what it had for the
// key). It is set by a reader of signed state (Options.CheckTool).
type CheckTool func(rec ToolRecord, key string, revision uint64) error

func (s *Store) apply(reg *tools.Registry, e jetstream.KeyValueEntry, log *slog.Logger) {
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		id, version, err := parseToolKey(e.Key())
		if err != nil {
			log.Warn("ignoring tool key", "key", e.Key(), "err", err)
			return
		}
		reg.Delete(id, version)
	default:
		rec := decodeToolRecord(e.Value())
		if s.checkTool != nil {
			if err := s.checkTool(rec, e.Key(), e.Revision()); err != nil {
				return
			}
		}
		m, err := ParseToolRecord(rec)
		if err != nil {
			log.Warn("ignoring invalid manifest in registry", "key", e.Key(), "err", err)
			return
		}
		reg.Put(m)
	}
}

// WatchToolsNotify is WatchTools that also calls changed after each change
// it applies to reg (the initial load included), so a holder of reg can tell
// its own clients that the registry moved. changed must not block.
func (s *Store) WatchToolsNotify(ctx context.Context, reg *tools.Registry, log *slog.Logger, changed func()) error {
	if log == nil {
		log = slog.Default()
	}
	return s.watch(ctx, s.tools, func(e jetstream.KeyValueEntry) {
		s.apply(reg, e, log)
		changed()
	})
}
