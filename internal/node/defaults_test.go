package node_test

import (
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/tools"
)

// TestLoadDefaults: serve --defaults reads the deployment's and each
// tenant's defaults where a manifest is silent; a member it does not know,
// or an impossible value, stops it with the member named.
func TestLoadDefaults(t *testing.T) {
	base, tenants, err := node.LoadDefaults([]byte(`{"concurrent_tools_per_agent": 8,
	  "tenants": {"acme": {"rate_limit": {"requests": 600, "per_seconds": 60, "burst": 20}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	s := &tools.Settings{Base: base, Tenants: tenants}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	acme, other := s.For("acme"), s.For("other")
	if acme.ConcurrentToolsPerAgent != 8 || acme.RateLimit == nil || acme.RateLimit.Requests != 600 {
		t.Errorf("acme's defaults: %+v, want 8 running and 600 a minute", acme)
	}
	if other.RateLimit == nil || other.RateLimit.Requests != 60 || other.ConcurrentToolsPerAgent != 8 {
		t.Errorf("another tenant's defaults: %+v, want the specification's rate and the deployment's 8", other)
	}

	if _, _, err := node.LoadDefaults([]byte(`{"concurrent_tools_per_agnet": 8}`)); api.AsError(err).ECode != api.EInvalidManifest {
		t.Errorf("a misspelt member: %v, want %s", err, api.EInvalidManifest)
	}
	base, tenants, err = node.LoadDefaults([]byte(`{"tenants": {"acme": {"rate_limit": {"requests": 0, "per_seconds": 60}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	err = (&tools.Settings{Base: base, Tenants: tenants}).Check()
	if e := api.AsError(err); err == nil || len(e.Fields) == 0 || e.Fields[0].Location != "/tenants/acme/rate_limit/requests" {
		t.Errorf("a rate of 0: %v, want a field error at /tenants/acme/rate_limit/requests", err)
	}
}
