package archivestore

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// NATS is an archive in a JetStream object store bucket. It reads without
// a consumer (objects by direct gets of their chunks, the listing from the
// stream's subjects): the audit role may create none (internal/busauth).
type NATS struct {
	js     jetstream.JetStream
	bucket string
}

// NewNATS is the archive in bucket; the bucket is made with the topology
// (EnsureBucket), by the operator.
func NewNATS(js jetstream.JetStream, bucket string) *NATS { return &NATS{js: js, bucket: bucket} }

func (s *NATS) String() string { return "nats://" + s.bucket }

// EnsureBucket makes the bucket when it is missing. Its stream refuses
// deletes of messages; purges it cannot refuse (an object's description is
// replaced by a roll-up, which JetStream allows only with purges), but no
// role but the operator may ask for one.
func (s *NATS) EnsureBucket(ctx context.Context, replicas int, storage jetstream.StorageType) error {
	if _, err := s.js.ObjectStore(ctx, s.bucket); err == nil {
		return nil
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	_, err := s.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: s.bucket,
		Description: "toolgate audit archive (append-only)", Replicas: replicas, Storage: storage})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return err
	}
	st, err := s.js.Stream(ctx, subjects.ObjectStream(s.bucket))
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if !cfg.DenyDelete {
		cfg.DenyDelete = true
		if _, err := s.js.UpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("making %s append-only: %w", cfg.Name, err)
		}
	}
	return nil
}

// Put implements Store.
func (s *NATS) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	obs, err := s.js.ObjectStore(ctx, s.bucket)
	if err != nil {
		return err
	}
	if _, err := obs.GetInfo(ctx, name); err == nil {
		return fmt.Errorf("%s: %w", name, ErrExists)
	} else if !errors.Is(err, jetstream.ErrObjectNotFound) {
		return err
	}
	info, err := obs.Put(ctx, jetstream.ObjectMeta{Name: name}, r)
	if err != nil {
		return err
	}
	if int64(info.Size) != size {
		return fmt.Errorf("%s: stored %d bytes of %d", name, info.Size, size)
	}
	return nil
}

// Get implements Store: the chunks read one by one by subject, and the
// whole checked against the object's digest.
func (s *NATS) Get(ctx context.Context, name string) ([]byte, error) {
	obs, err := s.js.ObjectStore(ctx, s.bucket)
	if err != nil {
		return nil, err
	}
	info, err := obs.GetInfo(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if info.Size > MaxObject {
		return nil, fmt.Errorf("%s: larger than %d bytes", name, MaxObject)
	}
	st, err := s.js.Stream(ctx, subjects.ObjectStream(s.bucket))
	if err != nil {
		return nil, err
	}
	chunks := subjects.ObjectChunks(s.bucket, info.NUID)
	out := make([]byte, 0, info.Size)
	h := sha256.New()
	seq := uint64(1)
	for range info.Chunks {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(chunks))
		if err != nil {
			return nil, fmt.Errorf("%s: chunk after %d: %w", name, seq, err)
		}
		out = append(out, m.Data...)
		h.Write(m.Data)
		seq = m.Sequence + 1
	}
	if uint64(len(out)) != info.Size {
		return nil, fmt.Errorf("%s: read %d bytes, the object says %d", name, len(out), info.Size)
	}
	if d := jetstream.GetObjectDigestValue(h); !strings.EqualFold(d, info.Digest) {
		return nil, fmt.Errorf("%s: digest %s, the object says %s", name, d, info.Digest)
	}
	return out, nil
}

// List implements Store.
func (s *NATS) List(ctx context.Context) ([]Object, error) {
	obs, err := s.js.ObjectStore(ctx, s.bucket)
	if err != nil {
		return nil, err
	}
	st, err := s.js.Stream(ctx, subjects.ObjectStream(s.bucket))
	if err != nil {
		return nil, err
	}
	si, err := st.Info(ctx, jetstream.WithSubjectFilter(subjects.ObjectMetas(s.bucket)))
	if err != nil {
		return nil, err
	}
	var out []Object
	prefix := subjects.ObjectMetas(s.bucket)
	prefix = prefix[:len(prefix)-1]
	for subj := range si.State.Subjects {
		enc := strings.TrimPrefix(subj, prefix)
		name, err := base64.URLEncoding.DecodeString(enc)
		if err != nil {
			continue // not an object's meta
		}
		info, err := obs.GetInfo(ctx, string(name))
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, Object{Name: info.Name, Size: int64(info.Size)})
	}
	return out, nil
}
