package node_test

import (
	"context"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
)

// TestTenantNamesEverywhere: the tenant rule ingest applies to subjects
// (subjects.CheckTenant) holds wherever a tenant enters: a token naming a
// wildcard or reserved tenant is refused before the policy sees its claims,
// and the control service's status, cancel and approval refuse such a
// tenant with E3019.
func TestTenantNamesEverywhere(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, tenant := range []string{"*", ">", "_system", "acme.other", "acme beta"} {
		t.Run(tenant, func(t *testing.T) {
			// Signed by the trusted key, but for a tenant no subject can name.
			c := grant(tenant, "*")
			c.Issuer, c.Audience = testIssuer, jwt.ClaimStrings{testAudience}
			c.ID = "bad-tenant"
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(time.Minute))
			tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c)
			tok.Header["kid"] = testKey().KID
			raw, err := tok.SignedString(testKey().Key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := token.Mint(testKey(), c); err == nil {
				t.Fatal("minted a token for tenant", tenant)
			}
			resp := e.invoke(withTok(request("acme", "noop", `{}`), raw))
			expectDenied(t, resp, api.StatusPermissionDenied, api.ETokenInvalid)

			_, err = e.client.Status(ctx, tenant, "some-id")
			wantECode(t, err, api.EInvalidName)
			_, err = e.client.Cancel(ctx, tenant, "some-id", "test")
			wantECode(t, err, api.EInvalidName)
			_, err = e.client.Decide(ctx, api.ApprovalDecision{Tenant: tenant, InvocationID: "some-id", DecidedBy: "op", Approve: true})
			wantECode(t, err, api.EInvalidName)
		})
	}
}
