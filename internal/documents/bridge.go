package documents

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
	"github.com/toolgate/toolgate/subjects"
)

// Store is the document cache (*kvstore.Store).
type Store interface {
	CachedDoc(ctx context.Context, source, id, version string) (kvstore.CachedDoc, bool, error)
	CacheDoc(ctx context.Context, source, id, version string, d kvstore.CachedDoc) error
	DropCachedDoc(ctx context.Context, source, id string) error
	DropCachedSource(ctx context.Context, source string) error
}

var _ Store = (*kvstore.Store)(nil)

// Config is how a Bridge reaches sources and caches documents.
type Config struct {
	Store Store
	// Sandbox runs stdio sources, as it runs mcp tools' servers;
	// SandboxErr, when set, says why they cannot run here.
	Sandbox    sandbox.Config
	SandboxErr error
	// StartTimeout bounds a source's start and handshake; default 30 s.
	StartTimeout time.Duration
	// Now is the clock cache expiry is read with; default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Bridge resolves document contexts; it implements execute.Documents.
// Sources are applied as the operator declares them (Apply); connections
// to them are made on first use and made again after a server goes away.
type Bridge struct {
	cfg    Config
	policy atomic.Pointer[policy.Documents]

	mu      sync.Mutex
	sources map[string]*source
	closed  bool
}

var _ execute.Documents = (*Bridge)(nil)

// source is one declared source and its live session.
type source struct {
	spec *Source

	mu         sync.Mutex
	sess       *mcptool.Session
	subscribed map[string]bool
}

// New returns a Bridge with the shipped document policy and no sources.
func New(cfg Config) (*Bridge, error) {
	cfg.StartTimeout = cmp.Or(cfg.StartTimeout, 30*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Bridge{cfg: cfg, sources: map[string]*source{}}
	p, err := policy.DefaultDocuments(context.Background())
	if err != nil {
		return nil, err
	}
	b.policy.Store(p)
	return b, nil
}

// SetPolicy replaces the document policy (from a pushed bundle).
func (b *Bridge) SetPolicy(p *policy.Documents) { b.policy.Store(p) }

// Apply declares (spec) or removes (nil) the source name; a replaced
// source's connection is closed.
func (b *Bridge) Apply(name string, spec *Source) {
	b.mu.Lock()
	old := b.sources[name]
	if spec == nil {
		delete(b.sources, name)
	} else {
		b.sources[name] = &source{spec: spec, subscribed: map[string]bool{}}
	}
	b.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// Names lists the declared sources, sorted.
func (b *Bridge) Names() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.sources))
	for n := range b.sources {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (b *Bridge) source(name string) *source {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sources[name]
}

// Close ends every source's connection.
func (b *Bridge) Close() {
	b.mu.Lock()
	b.closed = true
	srcs := b.sources
	b.sources = map[string]*source{}
	b.mu.Unlock()
	for _, s := range srcs {
		s.close()
	}
}

func (s *source) close() {
	s.mu.Lock()
	sess := s.sess
	s.sess = nil
	s.mu.Unlock()
	if sess != nil {
		sess.Close()
	}
}

// drop forgets sess when it is still the source's: the next use connects
// again.
func (s *source) drop(sess *mcptool.Session) {
	s.mu.Lock()
	if s.sess != sess {
		s.mu.Unlock()
		return
	}
	s.sess = nil
	s.subscribed = map[string]bool{}
	s.mu.Unlock()
	go sess.Close()
}

// session returns the source's live session, connecting when there is
// none or the last one ended.
func (b *Bridge) session(ctx context.Context, s *source) (*mcptool.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sess != nil {
		select {
		case <-s.sess.Done():
			s.sess.Close()
			s.sess = nil
			s.subscribed = map[string]bool{}
		default:
			return s.sess, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	h := mcptool.Handlers{ResourceUpdated: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
		if req == nil || req.Params == nil {
			return
		}
		b.updated(s.spec, req.Params.URI)
	}}
	var sess *mcptool.Session
	var err error
	if s.spec.URL != "" {
		sess, err = mcptool.DialHTTP(ctx, s.spec.URL, h)
	} else {
		if b.cfg.SandboxErr != nil {
			return nil, unavailable(s.spec.Name, "stdio sources cannot run here: %v", b.cfg.SandboxErr)
		}
		var sp sandbox.Spec
		sp, err = b.cfg.Sandbox.Build(sandbox.Request{Manifest: &tools.Manifest{ID: "docs:" + s.spec.Name},
			Argv: s.spec.Command, Env: s.spec.Env, ReadOnlyPaths: s.spec.ReadOnlyPaths,
			Defaults: sandbox.Limits{MemoryMB: mcptool.DefaultMemoryMB, PIDs: mcptool.DefaultPIDs}})
		if err == nil {
			sess, err = mcptool.DialStdio(ctx, b.cfg.Sandbox, sp, h)
		}
	}
	if err != nil {
		return nil, unavailable(s.spec.Name, "%v", err)
	}
	s.sess = sess
	return sess, nil
}

// subscribe asks the server to announce changes of uri, once per session,
// when it can.
func (s *source) subscribe(ctx context.Context, sess *mcptool.Session, uri string) {
	ir := sess.Client().InitializeResult()
	if ir == nil || ir.Capabilities == nil || ir.Capabilities.Resources == nil || !ir.Capabilities.Resources.Subscribe {
		return
	}
	s.mu.Lock()
	done := s.subscribed[uri] || s.sess != sess
	s.subscribed[uri] = true
	s.mu.Unlock()
	if !done {
		_ = sess.Client().Subscribe(ctx, &mcp.SubscribeParams{URI: uri})
	}
}

// updated drops the cached latest of the document a changed resource is.
func (b *Bridge) updated(spec *Source, uri string) {
	id, ok := spec.idOf(uri)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.cfg.Store.DropCachedDoc(ctx, spec.Name, id); err != nil {
		b.cfg.Log.Warn("dropping a changed document from the cache", "source", spec.Name, "document", id, "err", err)
	}
}

// Updated is the body of an announcement on subjects.DocsUpdated.
type Updated struct {
	DocumentID string `json:"document_id,omitempty"`
}

// Listen drops cached documents as their changes are announced on
// subjects.DocsUpdated, until the returned function is called.
func (b *Bridge) Listen(nc *nats.Conn) (stop func(), err error) {
	sub, err := nc.Subscribe(subjects.DocsUpdatedAll, func(m *nats.Msg) {
		name, ok := subjects.SourceOfDocsUpdated(m.Subject)
		if !ok {
			return
		}
		var u Updated
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &u) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if u.DocumentID == "" {
			err = b.cfg.Store.DropCachedSource(ctx, name)
		} else {
			err = b.cfg.Store.DropCachedDoc(ctx, name, u.DocumentID)
		}
		if err != nil {
			b.cfg.Log.Warn("dropping announced document changes from the cache", "source", name, "err", err)
		}
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

func unavailable(source, format string, args ...any) *api.Error {
	e := api.NewError(api.DocumentUnavailable, api.EDocUnavailable, "document source %s is unavailable: "+format,
		append([]any{source}, args...)...)
	return e.AsRetryable().WithDetail("not_started", true).WithDetail("source", source)
}

// isDown reports whether err says the source could not be reached or did
// not answer in time (a cached copy may then stand in).
func isDown(err error) bool {
	var te *api.Error
	return errors.As(err, &te) && (te.ECode == api.EDocUnavailable || te.ECode == api.EDocTimeout)
}
