package mcpfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
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
// from the tools bucket (NewNATSBus) or, for a connection holding only an
// agent's token, from its tenant's tools.list and tools.get endpoints
// (NewAgentBus).
type NATSBus struct {
	nc    *nats.Conn
	c     *client.Client
	tools toolSource
	log   *slog.Logger
	// tenant is the tenant of an agent's connection, whose endpoints it
	// calls; "" for service credentials, which call the operators'.
	tenant string

	// Results arrive on one core subscription per tenant and go to the
	// calls waiting for them, by result subject: no consumer per call.
	mu      sync.Mutex
	subs    map[string]*nats.Subscription // by the results subscribed to
	waiters map[string][]chan api.Response
}

// resultRecheck is how often Wait also reads the invocation's record, for
// a result published before it subscribed (a retried request whose
// original has already finished).
const resultRecheck = time.Second

var (
	_ Bus        = (*NATSBus)(nil)
	_ keyFetcher = (*NATSBus)(nil)
)

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
	return newNATSBus(ctx, nc, log, nil)
}

// newNATSBus is NewNATSBus whose registry honours only manifests an
// operator signed when proof is set (internal/signedstate); one that
// fails is logged and ignored.
func newNATSBus(ctx context.Context, nc *nats.Conn, log *slog.Logger, proof signedstate.Verify) (*NATSBus, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	c.Source = "urn:toolgate:mcp"
	opts := kvstore.Options{}
	if proof != nil {
		var order signedstate.Order
		opts.CheckTool = func(rec kvstore.ToolRecord, key string, rev uint64) error {
			err := order.Tool(rec, key, proof)
			if err != nil {
				log.Error("ignoring a tool manifest no operator signed", "key", key, "revision", rev, "err", err)
			}
			return err
		}
		// A revocation no operator signed ends no session.
		opts.CheckRevocation = func(rec kvstore.Revocation, jti string, rev uint64) error {
			err := signedstate.Revocation(rec, jti, proof)
			if err != nil {
				log.Error("ignoring a revocation no operator signed", "jti", jti, "revision", rev, "err", err)
			}
			return err
		}
	}
	store, err := kvstore.Open(ctx, js, opts)
	if err != nil {
		return nil, fmt.Errorf("opening the registry: %w", err)
	}
	return newBus(nc, c, &kvTools{store: store, reg: tools.NewRegistry(), log: log}, log), nil
}

// NewAgentBus is a Bus over nc connected as an agent of tenant (its
// capability token as the connect token, see ConnectOptions): such a
// connection may not read the tools bucket, so the registry is read from
// the tenant's tools.list and tools.get endpoints, again every interval
// (default DefaultRegistryInterval). The caller closes nc.
func NewAgentBus(nc *nats.Conn, tenant string, interval time.Duration, log *slog.Logger) (*NATSBus, error) {
	c, err := client.New(nc)
	if err != nil {
		return nil, err
	}
	c.Source = "urn:toolgate:mcp"
	b := newBus(nc, c, newScopedTools(c, tenant, interval, log), log)
	b.tenant = tenant
	return b, nil
}

func newBus(nc *nats.Conn, c *client.Client, src toolSource, log *slog.Logger) *NATSBus {
	return &NATSBus{nc: nc, c: c, tools: src, log: log,
		subs: map[string]*nats.Subscription{}, waiters: map[string][]chan api.Response{}}
}

// Invoke registers the call's waiter before publishing, so its result
// cannot slip past; Wait collects it.
func (b *NATSBus) Invoke(ctx context.Context, req api.Request, id string) error {
	tenant := req.AgentContext.TenantID
	if err := b.subscribe(tenant, req.AgentContext.AgentDID); err != nil {
		return err
	}
	subject := waiterKey(tenant, id)
	ch := make(chan api.Response, 1)
	b.mu.Lock()
	b.waiters[subject] = append(b.waiters[subject], ch)
	b.mu.Unlock()
	if _, err := b.c.Invoke(ctx, req, client.InvokeOptions{ID: id}); err != nil {
		b.forget(subject, ch)
		return err
	}
	return nil
}

// subscribe follows the results of agent's calls in tenant: the results an
// agent's connection may read are its own agent's (subjects.ResultAgent).
func (b *NATSBus) subscribe(tenant, agent string) error {
	results := subjects.ResultAgent(tenant, agent)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs[results] != nil {
		return nil
	}
	sub, err := b.nc.Subscribe(results, b.deliver)
	if err != nil {
		return fmt.Errorf("subscribing to results: %w", err)
	}
	b.subs[results] = sub
	return nil
}

// waiterKey is what the waiters of invocation id of tenant are kept under.
func waiterKey(tenant, id string) string { return tenant + " " + id }

func (b *NATSBus) deliver(m *nats.Msg) {
	tenant, _, id, ok := subjects.ParseResult(m.Subject)
	if !ok {
		return
	}
	key := waiterKey(tenant, id)
	b.mu.Lock()
	chs := b.waiters[key]
	b.mu.Unlock()
	if len(chs) == 0 {
		return
	}
	resp, err := client.DecodeResult(m.Data)
	if err != nil || !resp.Status.Terminal() {
		return // the pending answer of an async request, or noise
	}
	b.mu.Lock()
	chs = b.waiters[key]
	delete(b.waiters, key)
	b.mu.Unlock()
	for _, ch := range chs {
		ch <- resp
	}
}

func (b *NATSBus) forget(subject string, ch chan api.Response) {
	b.mu.Lock()
	defer b.mu.Unlock()
	chs := slices.DeleteFunc(b.waiters[subject], func(c chan api.Response) bool { return c == ch })
	if len(chs) == 0 {
		delete(b.waiters, subject)
	} else {
		b.waiters[subject] = chs
	}
}

func (b *NATSBus) Wait(ctx context.Context, tenant, id string) (api.Response, error) {
	subject := waiterKey(tenant, id)
	b.mu.Lock()
	var ch chan api.Response
	if chs := b.waiters[subject]; len(chs) > 0 {
		ch = chs[len(chs)-1]
	}
	b.mu.Unlock()
	if ch == nil { // not invoked through this bus: read the stream
		return b.c.Wait(ctx, tenant, id)
	}
	defer b.forget(subject, ch)
	t := time.NewTicker(resultRecheck)
	defer t.Stop()
	for {
		select {
		case resp := <-ch:
			return resp, nil
		case <-ctx.Done():
			return api.Response{}, ctx.Err()
		case <-t.C:
			rec, err := b.c.Status(ctx, tenant, id)
			if err == nil && rec.Status.Terminal() && rec.Response != nil {
				return *rec.Response, nil
			}
		}
	}
}

func (b *NATSBus) Status(ctx context.Context, tenant, id string) (api.Record, error) {
	return b.c.Status(ctx, tenant, id)
}

func (b *NATSBus) Cancel(ctx context.Context, tenant, id, reason string) error {
	_, err := b.c.Cancel(ctx, tenant, id, reason)
	return err
}

func (b *NATSBus) Tools() []*tools.Manifest { return b.tools.Tools() }

// TokenKeys fetches the public key set the deployment verifies tokens
// with: from the tenant's endpoint on an agent's connection.
func (b *NATSBus) TokenKeys(ctx context.Context) ([]byte, error) {
	return b.c.TokenKeys(ctx, b.tenant)
}

func (b *NATSBus) WatchTools(ctx context.Context, changed func()) error {
	return b.tools.WatchTools(ctx, changed)
}

// WatchRevocations calls revoked with each token id revoked, when the
// front end reads the buckets itself (service credentials); an agent's
// connection may not read them, and errors.
func (b *NATSBus) WatchRevocations(ctx context.Context, revoked func(jti string)) error {
	k, ok := b.tools.(*kvTools)
	if !ok {
		return errors.New("the registry is read through the tenant's endpoints, not the buckets")
	}
	return k.store.WatchRevocations(ctx, func(jti string, on bool) {
		if on {
			revoked(jti)
		}
	}, nil)
}

// readsBuckets reports whether b reads the buckets itself.
func (b *NATSBus) readsBuckets() bool { _, ok := b.tools.(*kvTools); return ok }

// toolSource is where a NATSBus reads the registry from.
type toolSource interface {
	Tools() []*tools.Manifest
	WatchTools(ctx context.Context, changed func()) error
}

// kvTools reads the registry from the tools bucket, which operators and
// toolgate's own processes may read.
type kvTools struct {
	store *kvstore.Store
	reg   *tools.Registry
	log   *slog.Logger
}

func (k *kvTools) Tools() []*tools.Manifest { return k.reg.List() }

func (k *kvTools) WatchTools(ctx context.Context, changed func()) error {
	return k.store.WatchToolsNotify(ctx, k.reg, k.log, changed)
}
