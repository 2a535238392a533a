package kvstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// --- document sources and document cache (docs/documents.md) ----------------

var docSourcesConfig = jetstream.KeyValueConfig{
	Bucket: subjects.BucketDocSources, Description: "toolgate document sources by name", History: 5,
}

// DocCacheMaxAge is how long any cached document is kept: the life of an
// immutable version. The latest version of a document expires sooner, by
// the expiry written in its entry.
const DocCacheMaxAge = 24 * time.Hour

var docCacheConfig = jetstream.KeyValueConfig{
	Bucket: subjects.BucketDocCache, Description: "toolgate cached documents by source, document and version",
	History: 1, TTL: DocCacheMaxAge,
}

// DocSourceRecord is a stored document source with the operator's signed
// request that added it. Readers on an authenticated bus honour none
// without one (internal/signedstate).
type DocSourceRecord struct {
	Name     string             `json:"name"`
	Source   json.RawMessage    `json:"source"`
	By       string             `json:"by,omitempty"`
	Proof    *api.DecisionProof `json:"proof,omitempty"`
	Revision uint64             `json:"-"`
}

// PutDocSource stores a source document under name, replacing an earlier
// one, with the signed request proof of the operator by (nil on a bus
// without authentication).
func (s *Store) PutDocSource(ctx context.Context, name string, doc json.RawMessage, by string, proof *api.DecisionProof) (uint64, error) {
	val, err := json.Marshal(DocSourceRecord{Name: name, Source: doc, By: by, Proof: proof})
	if err != nil {
		return 0, err
	}
	rev, err := s.docsources.Put(ctx, subjects.Token(name), val)
	if err != nil {
		return 0, fmt.Errorf("storing document source %s: %w", name, err)
	}
	return rev, nil
}

// ErrDocSourceNotFound is an unknown document source.
var ErrDocSourceNotFound = errors.New("unknown document source")

// DeleteDocSource removes a source.
func (s *Store) DeleteDocSource(ctx context.Context, name string) error {
	key := subjects.Token(name)
	if _, err := s.docsources.Get(ctx, key); errors.Is(err, jetstream.ErrKeyNotFound) {
		return ErrDocSourceNotFound
	}
	return s.docsources.Delete(ctx, key)
}

// DocSources lists the stored sources; entries that do not decode are
// skipped.
func (s *Store) DocSources(ctx context.Context) ([]DocSourceRecord, error) {
	keys, err := s.keys(ctx, s.docsources, ">")
	if err != nil {
		return nil, err
	}
	var out []DocSourceRecord
	for _, k := range keys {
		e, err := s.docsources.Get(ctx, k)
		if err != nil {
			continue
		}
		var r DocSourceRecord
		if json.Unmarshal(e.Value(), &r) == nil {
			r.Revision = e.Revision()
			out = append(out, r)
		}
	}
	return out, nil
}

// WatchDocSources calls fn with every source as stored and with nil and
// the name for a removed one; it returns once the stored sources are
// applied and follows changes until ctx ends.
func (s *Store) WatchDocSources(ctx context.Context, fn func(name string, rec *DocSourceRecord)) error {
	return s.watch(ctx, s.docsources, func(e jetstream.KeyValueEntry) {
		name, err := subjects.Untoken(e.Key())
		if err != nil {
			return
		}
		if e.Operation() != jetstream.KeyValuePut {
			fn(name, nil)
			return
		}
		var r DocSourceRecord
		if json.Unmarshal(e.Value(), &r) != nil || r.Name != name {
			return
		}
		r.Revision = e.Revision()
		fn(name, &r)
	})
}

// CachedDoc is a document as the cache keeps it.
type CachedDoc struct {
	Version  string    `json:"version"`
	MIMEType string    `json:"mime_type,omitempty"`
	Content  []byte    `json:"content"`
	Expires  time.Time `json:"expires"`
}

// docKey is the cache key of a document's latest (version "") or of one
// immutable version.
func docKey(source, id, version string) string {
	k := subjects.Token(source) + "." + subjects.Token(id)
	if version != "" {
		k += ".v." + subjects.Token(version)
	}
	return k
}

// CachedDoc returns the cached document (its latest when version is "");
// ok is false when there is none. An entry past its Expires is returned
// too: the caller serves it only when the source cannot be reached.
func (s *Store) CachedDoc(ctx context.Context, source, id, version string) (CachedDoc, bool, error) {
	e, err := s.doccache.Get(ctx, docKey(source, id, version))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return CachedDoc{}, false, nil
	}
	if err != nil {
		return CachedDoc{}, false, err
	}
	var d CachedDoc
	if json.Unmarshal(e.Value(), &d) != nil {
		return CachedDoc{}, false, nil
	}
	return d, true, nil
}

// CacheDoc stores d as the document's latest (version "") or as one of its
// versions.
func (s *Store) CacheDoc(ctx context.Context, source, id, version string, d CachedDoc) error {
	val, err := json.Marshal(d)
	if err != nil {
		return err
	}
	_, err = s.doccache.Put(ctx, docKey(source, id, version), val)
	return err
}

// DropCachedDoc forgets the cached latest of a document (its immutable
// versions stay: they cannot change).
func (s *Store) DropCachedDoc(ctx context.Context, source, id string) error {
	err := s.doccache.Purge(ctx, docKey(source, id, ""))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}

// DropCachedSource forgets the cached latest of every document of source.
func (s *Store) DropCachedSource(ctx context.Context, source string) error {
	keys, err := s.keys(ctx, s.doccache, subjects.Token(source)+".*")
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := s.doccache.Purge(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
	}
	return nil
}
