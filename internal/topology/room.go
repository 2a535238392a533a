package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// errNoRoom is a single server's answer to a stream whose byte limit its
// store cannot reserve (err_code 10047).
const errNoRoom jetstream.ErrorCode = 10047

// MinStreamBytes is the least fitRoom lowers a default byte limit to.
const MinStreamBytes = 64 << 20

// fitRoom lowers, in place, the default byte limits of the file streams
// in missing (those set leaves zero) in one proportion, so that all of
// missing's limits fit in nine tenths of set.StoreRoom: a machine with
// little free disk still starts, with smaller streams, and says so. A
// limit the operator set is never lowered, nor one below MinStreamBytes.
func fitRoom(missing []jetstream.StreamConfig, set TopologyOptions) {
	if set.StoreRoom <= 0 {
		return
	}
	var fixed, scaled int64
	for _, cfg := range missing {
		switch {
		case cfg.Storage != jetstream.FileStorage || cfg.MaxBytes <= 0:
		case limitDefaulted(cfg, set):
			scaled += cfg.MaxBytes * int64(max(cfg.Replicas, 1))
		default:
			fixed += cfg.MaxBytes * int64(max(cfg.Replicas, 1))
		}
	}
	room := set.StoreRoom / 10 * 9
	if scaled == 0 || fixed+scaled <= room {
		return
	}
	log := set.Log
	if log == nil {
		log = slog.Default()
	}
	share := float64(max(room-fixed, 0)) / float64(scaled)
	for i := range missing {
		cfg := &missing[i]
		if cfg.Storage != jetstream.FileStorage || cfg.MaxBytes <= 0 || !limitDefaulted(*cfg, set) {
			continue
		}
		lowered := max(int64(float64(cfg.MaxBytes)*share)/(1<<20)*(1<<20), MinStreamBytes)
		if lowered >= cfg.MaxBytes {
			continue
		}
		log.Warn("the NATS server's store has no room for a stream's default byte limit: it is made with a smaller one "+
			"(free disk space, or set the limits: docs/operations.md)",
			"stream", cfg.Name, "max_bytes", lowered, "default", cfg.MaxBytes, "store_room", set.StoreRoom)
		cfg.MaxBytes = lowered
	}
}

// createStream creates cfg; a store with no room for its byte limit is
// said so in plain words.
func createStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	_, err := js.CreateStream(ctx, cfg)
	var apiErr *jetstream.APIError
	switch {
	case err == nil, errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
		return nil
	case errors.As(err, &apiErr) && apiErr.ErrorCode == errNoRoom:
		return fmt.Errorf("creating stream %s: the NATS server's store has no room for its byte limit of %d bytes "+
			"(a server reserves each stream's limit out of its store, by default three quarters of the disk's free space): "+
			"free disk space or lower the limit: %w", cfg.Name, cfg.MaxBytes, err)
	}
	return fmt.Errorf("creating stream %s: %w", cfg.Name, err)
}

// limitDefaulted tells whether cfg's byte limit is a default of
// TopologyOptions that set leaves zero, not one an operator chose.
func limitDefaulted(cfg jetstream.StreamConfig, set TopologyOptions) bool {
	switch cfg.Name {
	case subjects.StreamInvoke:
		return set.InvokeMaxBytes == 0
	case subjects.StreamPipeline, subjects.StreamRelay:
		return set.PipelineMaxBytes == 0
	case subjects.StreamResults:
		return set.ResultMaxBytes == 0
	case subjects.StreamAudit, subjects.StreamAuditChain:
		return set.AuditMaxBytes == 0
	case subjects.StreamDeadLetter:
		return true
	}
	return false
}
