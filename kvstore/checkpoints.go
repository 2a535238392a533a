package kvstore

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// compressAbove is the state size from which checkpoints are stored gzipped.
const compressAbove = 4 << 10

// maxCheckpointBytes bounds one checkpoint's state before compression, and
// maxStoredBytes after (NATS's default largest message is 1 MiB).
const (
	maxCheckpointBytes = 8 << 20
	maxStoredBytes     = 1000 << 10
)

// Checkpoint is the saved state of a running invocation.
type Checkpoint struct {
	Seq       int             `json:"seq"`
	CreatedAt time.Time       `json:"created_at"`
	State     json.RawMessage `json:"-"`
}

type storedCheckpoint struct {
	Seq       int       `json:"seq"`
	CreatedAt time.Time `json:"created_at"`
	Gzip      bool      `json:"gzip,omitempty"`
	Data      []byte    `json:"data"`
}

// SaveCheckpoint stores c as the latest checkpoint of an invocation and
// returns the stored size. Large states are gzipped. The bucket's max age
// expires a checkpoint that is not renewed (default 24 h).
func (s *Store) SaveCheckpoint(ctx context.Context, tenant, id string, c Checkpoint) (int, error) {
	if len(c.State) > maxCheckpointBytes {
		return 0, fmt.Errorf("checkpoint of %d bytes is over the %d byte limit", len(c.State), maxCheckpointBytes)
	}
	sc := storedCheckpoint{Seq: c.Seq, CreatedAt: c.CreatedAt, Data: c.State}
	if len(c.State) > compressAbove {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(c.State); err != nil {
			return 0, err
		}
		if err := zw.Close(); err != nil {
			return 0, err
		}
		sc.Gzip, sc.Data = true, buf.Bytes()
	}
	val, err := json.Marshal(sc)
	if err != nil {
		return 0, err
	}
	if len(val) > maxStoredBytes {
		return 0, fmt.Errorf("checkpoint stores %d bytes, over the %d byte limit", len(val), maxStoredBytes)
	}
	if _, err := s.checkpoints.Put(ctx, invocationKey(tenant, id), val); err != nil {
		return 0, fmt.Errorf("saving checkpoint: %w", err)
	}
	return len(val), nil
}

// LoadCheckpoint returns the latest checkpoint of an invocation; ok is false
// when there is none.
func (s *Store) LoadCheckpoint(ctx context.Context, tenant, id string) (c Checkpoint, ok bool, err error) {
	e, err := s.checkpoints.Get(ctx, invocationKey(tenant, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Checkpoint{}, false, nil
	}
	if err != nil {
		return Checkpoint{}, false, err
	}
	var sc storedCheckpoint
	if err := json.Unmarshal(e.Value(), &sc); err != nil {
		return Checkpoint{}, false, fmt.Errorf("decoding checkpoint: %w", err)
	}
	c = Checkpoint{Seq: sc.Seq, CreatedAt: sc.CreatedAt, State: sc.Data}
	if sc.Gzip {
		zr, err := gzip.NewReader(bytes.NewReader(sc.Data))
		if err != nil {
			return Checkpoint{}, false, fmt.Errorf("decompressing checkpoint: %w", err)
		}
		if c.State, err = io.ReadAll(io.LimitReader(zr, maxCheckpointBytes+1)); err != nil {
			return Checkpoint{}, false, fmt.Errorf("decompressing checkpoint: %w", err)
		}
	}
	return c, true, nil
}

// DeleteCheckpoint removes an ended invocation's checkpoint.
func (s *Store) DeleteCheckpoint(ctx context.Context, tenant, id string) error {
	return s.checkpoints.Delete(ctx, invocationKey(tenant, id))
}
