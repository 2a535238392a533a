package mcpfront

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/tools"
)

// DefaultRegistryInterval is how often an agent's front end reads its
// tenant's tool listing again (NewAgentBus): an agent cannot watch the
// tools bucket, so a registry change reaches its tools/list within this.
const DefaultRegistryInterval = 5 * time.Second

// scopedRequestTimeout bounds each request to the control service: a
// request the bus refuses gets no answer at all.
const scopedRequestTimeout = 5 * time.Second

// scopedTools is the registry as a tenant's tools.list and tools.get
// endpoints show it. The listing is read every interval; a manifest is
// fetched only for a tool whose listing entry changed.
type scopedTools struct {
	c        *client.Client
	tenant   string
	interval time.Duration
	log      *slog.Logger

	mu    sync.Mutex
	byID  map[string]scopedEntry
	list  []*tools.Manifest
	stale bool // the last read failed (logged once until one succeeds)
}

type scopedEntry struct {
	sig string // the listing entry, as JSON: a change means fetch again
	m   *tools.Manifest
}

func newScopedTools(c *client.Client, tenant string, interval time.Duration, log *slog.Logger) *scopedTools {
	if interval <= 0 {
		interval = DefaultRegistryInterval
	}
	if log == nil {
		log = slog.Default()
	}
	return &scopedTools{c: c, tenant: tenant, interval: interval, log: log, byID: map[string]scopedEntry{}}
}

func (s *scopedTools) Tools() []*tools.Manifest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list
}

// WatchTools reads the registry once, failing if it cannot, then again
// every interval until ctx ends.
func (s *scopedTools) WatchTools(ctx context.Context, changed func()) error {
	if _, err := s.load(ctx); err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(s.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ok, err := s.load(ctx)
			s.mu.Lock()
			wasStale := s.stale
			s.stale = err != nil
			s.mu.Unlock()
			switch {
			case err != nil && !wasStale && ctx.Err() == nil:
				s.log.Warn("reading the tool registry; tools/list stays as it was", "tenant", s.tenant, "err", err)
			case ok:
				changed()
			}
		}
	}()
	return nil
}

// load reads the listing and the manifests that changed, and reports
// whether anything did.
func (s *scopedTools) load(ctx context.Context) (bool, error) {
	var entries []api.ToolSummary
	req := api.ListRequest{PageSize: 200}
	for {
		rctx, cancel := context.WithTimeout(ctx, scopedRequestTimeout)
		page, err := s.c.SearchTools(rctx, s.tenant, req)
		cancel()
		if err != nil {
			return false, fmt.Errorf("listing the tools of tenant %s: %w", s.tenant, err)
		}
		entries = append(entries, page.Tools...)
		if page.NextCursor == "" {
			break
		}
		req.Cursor = page.NextCursor
	}
	s.mu.Lock()
	old := s.byID
	s.mu.Unlock()
	next := make(map[string]scopedEntry, len(entries))
	changed := len(old) != len(entries)
	for _, e := range entries {
		e.Score, e.Terms = 0, nil
		b, _ := json.Marshal(e)
		sig := string(b)
		if o, ok := old[e.ToolID]; ok && o.sig == sig {
			next[e.ToolID] = o
			continue
		}
		changed = true
		rctx, cancel := context.WithTimeout(ctx, scopedRequestTimeout)
		doc, err := s.c.GetTenantTool(rctx, s.tenant, e.ToolID, e.LatestVersion)
		cancel()
		if err != nil {
			return false, fmt.Errorf("reading tool %s: %w", e.ToolID, err)
		}
		m := new(tools.Manifest)
		if err := json.Unmarshal(doc, m); err != nil {
			return false, fmt.Errorf("decoding tool %s: %w", e.ToolID, err)
		}
		next[e.ToolID] = scopedEntry{sig: sig, m: m}
	}
	if !changed {
		return false, nil
	}
	list := make([]*tools.Manifest, 0, len(next))
	for _, e := range next {
		list = append(list, e.m)
	}
	slices.SortFunc(list, func(a, b *tools.Manifest) int { return strings.Compare(a.ID, b.ID) })
	s.mu.Lock()
	s.byID, s.list = next, list
	s.mu.Unlock()
	return true, nil
}
