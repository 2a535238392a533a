package mcpfront

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
)

// Bus is everything the MCP front end needs from toolgate. It is the only
// place that knows subjects and buckets: moving to tenant-scoped control
// endpoints, or to a connection that may only read what its token allows,
// changes an implementation of Bus and nothing else.
type Bus interface {
	// Invoke publishes req as a tool.invoke event with invocation id id.
	// Publishing the same id again is deduplicated by toolgate.
	Invoke(ctx context.Context, req api.Request, id string) error
	// Wait returns the response of invocation id of tenant once it exists.
	Wait(ctx context.Context, tenant, id string) (api.Response, error)
	// Status returns the invocation's record (status, progress).
	Status(ctx context.Context, tenant, id string) (api.Record, error)
	// Cancel asks toolgate to stop the invocation.
	Cancel(ctx context.Context, tenant, id, reason string) error
	// Tools returns the latest serving version of every registered tool.
	Tools() []*tools.Manifest
	// WatchTools returns once Tools reflects the registry, then calls
	// changed (which must not block) after every change until ctx ends.
	WatchTools(ctx context.Context, changed func()) error
}

// NATSBus is Bus over one NATS connection: invocations and results through
// JetStream, control requests through the control service, the registry
// from the tools bucket.
type NATSBus struct {
	nc    *nats.Conn
	c     *client.Client
	store *kvstore.Store
	reg   *tools.Registry
	log   *slog.Logger
}

var _ Bus = (*NATSBus)(nil)

// ConnectOptions are the NATS options of an agent's connection: with a
// capability token, the token is the connect token and replies come to the
// agent's private inbox prefix (see busauth.InboxPrefix), so a deployment
// with bus authentication admits the connection by its token.
func ConnectOptions(claims *token.Claims, raw string) []nats.Option {
	opts := []nats.Option{nats.Name("toolgate-mcp")}
	if raw != "" && claims != nil {
		opts = append(opts, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(claims.TenantID, claims.ID)))
	}
	return opts
}

// NewNATSBus opens the buckets over nc. The caller closes nc.
func NewNATSBus(ctx context.Context, nc *nats.Conn, log *slog.Logger) (*NATSBus, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	c.Source = "urn:toolgate:mcp"
	store, err := kvstore.Open(ctx, js, kvstore.Options{})
	if err != nil {
		return nil, fmt.Errorf("opening the registry: %w", err)
	}
	return &NATSBus{nc: nc, c: c, store: store, reg: tools.NewRegistry(), log: log}, nil
}

func (b *NATSBus) Invoke(ctx context.Context, req api.Request, id string) error {
	_, err := b.c.Invoke(ctx, req, client.InvokeOptions{ID: id})
	return err
}

func (b *NATSBus) Wait(ctx context.Context, tenant, id string) (api.Response, error) {
	return b.c.Wait(ctx, tenant, id)
}

func (b *NATSBus) Status(ctx context.Context, tenant, id string) (api.Record, error) {
	return b.c.Status(ctx, tenant, id)
}

func (b *NATSBus) Cancel(ctx context.Context, tenant, id, reason string) error {
	_, err := b.c.Cancel(ctx, tenant, id, reason)
	return err
}

func (b *NATSBus) Tools() []*tools.Manifest { return b.reg.List() }

func (b *NATSBus) WatchTools(ctx context.Context, changed func()) error {
	return b.store.WatchToolsNotify(ctx, b.reg, b.log, changed)
}
