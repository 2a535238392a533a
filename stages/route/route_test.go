package route

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/ratelimit"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"
)

type fakeLimiter struct {
	ok   bool
	wait time.Duration
	err  error
}

func (f fakeLimiter) AllowCall(context.Context, string, string, *tools.Manifest, string, bool) (bool, time.Duration, error) {
	return f.ok, f.wait, f.err
}

func (f fakeLimiter) Applies(string, string, *tools.Manifest) (tools.RateLimit, string, bool) {
	return tools.RateLimit{Requests: 5, PerSeconds: 1}, ratelimit.SourceManifest, true
}

func TestRoute(t *testing.T) {
	reg := tools.NewRegistry()
	put := func(id, version, kind, state, successor string) {
		reg.Put(&tools.Manifest{ID: id, Version: version, Kind: kind,
			Lifecycle: tools.Lifecycle{State: state, DeprecatedInFavorOf: successor}})
	}
	put("echo", "1.0.0", "builtin", tools.StateActive, "")
	put("echo", "1.2.0", "builtin", tools.StateActive, "")
	put("echo", "2.0.0", "builtin", tools.StateActive, "")
	put("old", "1.0.0", "builtin", tools.StateDeprecated, "echo")
	put("gone", "1.0.0", "builtin", tools.StateRemoved, "echo")
	put("llm", "1.0.0", "model", tools.StateActive, "")

	cases := []struct {
		name, tool, version string
		limits              limiter
		wantVersion         string
		wantECode           string
		wantTransient       bool
		wantWarning         string
	}{
		{name: "latest when no version", tool: "echo", wantVersion: "2.0.0"},
		{name: "exact version", tool: "echo", version: "1.0.0", wantVersion: "1.0.0"},
		{name: "highest in a range", tool: "echo", version: "^1.0.0", wantVersion: "1.2.0"},
		{name: "unknown tool", tool: "nope", wantECode: api.EToolNotFound},
		{name: "unknown version", tool: "echo", version: "3.0.0", wantECode: api.EVersionNotFound},
		{name: "removed version refused", tool: "gone", version: "1.0.0", wantECode: api.EToolRemoved},
		{name: "deprecated version warns", tool: "old", version: "1.0.0", wantVersion: "1.0.0", wantWarning: api.EToolDeprecated},
		{name: "kind without executor", tool: "llm", wantECode: api.EExecutorUnavailable},
		{name: "within rate limit", tool: "echo", limits: fakeLimiter{ok: true}, wantVersion: "2.0.0"},
		{name: "over rate limit", tool: "echo", limits: fakeLimiter{wait: 250 * time.Millisecond}, wantECode: api.ERateLimited},
		{name: "rate limit store down is transient", tool: "echo", limits: fakeLimiter{err: errors.New("kv down")}, wantTransient: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := New(reg, "builtin")
			if c.limits != nil {
				r.Limits = c.limits
			}
			inv := &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{ToolID: c.tool, ToolVersion: c.version}}
			outs, err := r.Process(context.Background(), inv)
			if len(outs) != 0 {
				t.Fatalf("route published %d outputs", len(outs))
			}
			if _, transient := stages.IsTransient(err); transient != c.wantTransient {
				t.Fatalf("transient = %v, want %v (%v)", transient, c.wantTransient, err)
			}
			if c.wantTransient {
				return
			}
			if c.wantECode != "" {
				var ae *api.Error
				if !errors.As(err, &ae) || ae.ECode != c.wantECode {
					t.Fatalf("err = %v, want %s", err, c.wantECode)
				}
				if c.wantECode == api.ERateLimited && (!ae.Retryable || ae.Details["retry_after_ms"] != int64(250)) {
					t.Fatalf("rate limit refusal not retryable with retry_after_ms: %+v", ae)
				}
				if inv.Route != nil {
					t.Fatal("refused invocation was routed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if inv.Route == nil || inv.Route.ToolVersion != c.wantVersion || inv.Route.Executor != "builtin" || inv.Metadata.Executor != "builtin" {
				t.Fatalf("route %+v, want version %s on builtin", inv.Route, c.wantVersion)
			}
			warned := strings.Join(inv.Metadata.Warnings, ";")
			if (c.wantWarning == "") != (warned == "") || !strings.Contains(warned, c.wantWarning) {
				t.Fatalf("warnings %q, want %q", warned, c.wantWarning)
			}
		})
	}
}

// TestRouteSite: a site's tool is routed to its site, with the deadline
// of its wait there; a hub tool names no site and no deadline.
func TestRouteSite(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "lab", Version: "1.0.0", Kind: "builtin", Site: "lab-eu"})
	reg.Put(&tools.Manifest{ID: "hub", Version: "1.0.0", Kind: "builtin"})
	r := New(reg, "builtin")
	r.SiteWait = time.Minute
	for tool, site := range map[string]string{"lab": "lab-eu", "hub": ""} {
		inv := &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{ToolID: tool}}
		before := time.Now()
		if _, err := r.Process(context.Background(), inv); err != nil {
			t.Fatal(err)
		}
		if inv.Route.Site != site {
			t.Errorf("%s routed to site %q, want %q", tool, inv.Route.Site, site)
		}
		if d := inv.Route.SiteDeadline; (site == "") != d.IsZero() || (site != "" && d.Before(before.Add(time.Minute))) {
			t.Errorf("%s: site deadline %v, want a minute from now for a site's tool only", tool, d)
		}
	}
}

// TestRouteRemovedSite: a call for the tool of a site the deployment no
// longer declares ends at route (E3273), naming the site; a declared
// site's and a hub tool's go on.
func TestRouteRemovedSite(t *testing.T) {
	reg := tools.NewRegistry()
	reg.Put(&tools.Manifest{ID: "gone", Version: "1.0.0", Kind: "builtin", Site: "lab-us"})
	reg.Put(&tools.Manifest{ID: "lab", Version: "1.0.0", Kind: "builtin", Site: "lab-eu"})
	reg.Put(&tools.Manifest{ID: "hub", Version: "1.0.0", Kind: "builtin"})
	r := New(reg, "builtin")
	r.SiteDeclared = func(site string) bool { return site == "lab-eu" }
	call := func(tool string) error {
		_, err := r.Process(context.Background(), &envelope.Invocation{ID: "i", Tenant: "acme", Request: &api.Request{ToolID: tool}})
		return err
	}
	var ae *api.Error
	if err := call("gone"); !errors.As(err, &ae) || ae.ECode != api.ESiteRemoved || ae.Details["site"] != "lab-us" {
		t.Errorf("a removed site's tool: %v, want E3273 naming lab-us", err)
	}
	for _, tool := range []string{"lab", "hub"} {
		if err := call(tool); err != nil {
			t.Errorf("%s: %v", tool, err)
		}
	}
}
