package mcpfront

import (
	"errors"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
)

// TestAgentFrontServesItsAgentOnly: a front end connected as an agent
// (not a tenant reader) reads only that agent's results and status, so it
// refuses another agent's token of the same tenant rather than leave its
// calls waiting on results it cannot read.
func TestAgentFrontServesItsAgentOnly(t *testing.T) {
	f := &Front{cfg: Config{Tenant: "demo", agent: "did:agent:a"}}
	if err := f.checkClaims(&token.Claims{TenantID: "demo", AgentDID: "did:agent:a"}); err != nil {
		t.Fatalf("its own agent's token: %v", err)
	}
	err := f.checkClaims(&token.Claims{TenantID: "demo", AgentDID: "did:agent:b"})
	if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ENotGranted}) {
		t.Fatalf("another agent's token: %v, want E3210", err)
	}
	reader := &Front{cfg: Config{Tenant: "demo"}} // connected as a tenant reader
	if err := reader.checkClaims(&token.Claims{TenantID: "demo", AgentDID: "did:agent:b"}); err != nil {
		t.Fatalf("a reader's front end refused another agent of its tenant: %v", err)
	}
}
