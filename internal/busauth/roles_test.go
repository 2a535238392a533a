package busauth

import (
	"errors"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/kvstore"
)

// allows reports whether perm lets subject through: some allow matches it
// (or there is no allow list) and no deny does, as nats-server decides.
func allows(perm jwt.Permission, subject string) bool {
	ok := len(perm.Allow) == 0
	for _, a := range perm.Allow {
		if server.SubjectMatchesFilter(subject, a) {
			ok = true
		}
	}
	for _, d := range perm.Deny {
		if server.SubjectMatchesFilter(subject, d) {
			return false
		}
	}
	return ok
}

func TestGrantFor(t *testing.T) {
	agent := Identity{Role: RoleAgent, Tenant: "demo", TokenID: "tok-1"}
	type check struct {
		pub     bool // publish (else subscribe)
		subject string
		allowed bool
	}
	cases := []struct {
		name    string
		id      Identity
		account string
		checks  []check
	}{
		{"agent", agent, AccountAgents, []check{
			{true, "tool.invoke.demo", true},
			{true, "tool.invoke.other", false},
			{true, "tool.svc.demo.status", true},
			{true, "tool.svc.demo.cancel", true},
			{true, "tool.svc.demo.tools.list", true},
			{true, "tool.svc.demo.tools.get", true},
			{true, "tool.svc.demo.capability.request", true},
			{true, "tool.svc.demo.capability.report", true},
			{true, "tool.svc.other.capability.request", false},
			{true, "tool.svc.capability.report", false},
			{true, "tool.svc.tools.stats", false},
			{true, "tool.svc.models.stats", false},
			{true, "tool.svc.demo.tools.register", false},
			{true, "tool.svc.demo.budget", true},
			{true, "tool.svc.demo.approvals.list", true},
			{true, "tool.svc.demo.approvals.get", true},
			{true, "tool.svc.other.approvals.list", false},
			{true, "tool.svc.approvals.list", false},
			{true, "tool.svc.budget", false},
			{true, "tool.svc.other.status", false},
			{true, "tool.svc.approval", false},
			{true, "tool.svc.status", false},
			{true, "tool.svc.policy.push", false},
			{true, "tool.svc.policy.get", false},
			{true, "tool.svc.hooks.push", false},
			{true, "tool.svc.hooks.list", false},
			{true, "tool.svc.tokens.revoke", false},
			{true, "tool.svc.breakers.set", false},
			{true, "tool.svc.models.register", false},
			{true, "tool.svc.demo.policy.push", false},
			{true, "toolgate.pipe.execute.normal.demo", false},
			{true, "tool.result.demo.x", false},
			{true, "audit.demo.tool.succeeded", false},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.x", true},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.other.x", false},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS", false},
			{true, "$JS.API.STREAM.DELETE.AUDIT", false},
			{true, "$JS.API.CONSUMER.CREATE.AUDIT.x.audit.demo.>", false},
			{true, "$KV.toolgate_revocations.x", false},
			{false, "tool.result.demo.>", true},
			{false, "tool.result.demo.abc", true},
			{false, "audit.demo.>", true},
			{false, "tool.result.other.>", false},
			{false, "audit.>", false},
			{false, "_INBOX.demo.tok-1.>", true},
			{false, "_INBOX.demo.>", false},
			{false, "_INBOX.>", false},
			{false, "toolgate.pipe.>", false},
		}},
		{"worker", Identity{Role: RoleWorker, Name: "w"}, AccountToolgate, []check{
			{true, "toolgate.pipe.execute.normal.demo", true},
			{true, "tool.result.demo.x", true},
			{true, "audit.demo.tool.succeeded", true},
			{true, "$JS.API.STREAM.CREATE.AUDIT", true},
			{true, "$JS.API.CONSUMER.CREATE.AUDIT.x", true},
			{true, "$KV.toolgate_invocations.k", true},
			{true, "$JS.API.STREAM.DELETE.AUDIT", false},
			{true, "$JS.API.STREAM.PURGE.AUDIT", false},
			{true, "$JS.API.STREAM.UPDATE.AUDIT", false},
			{true, "$JS.API.STREAM.MSG.DELETE.AUDIT", false},
			{true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_INVOKE", true},
			{true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_PIPELINE", true},
			{true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_RESULTS", false},
			{true, "$JS.API.STREAM.MSG.DELETE.KV_toolgate_invocations", false},
			{true, "$KV.toolgate_revocations.x", false},
			{true, "$KV.toolgate_policies.x", false},
			{true, "$KV.toolgate_hooks.x", false},
			{true, "$KV.toolgate_tools.echo", false},
			{true, "$KV.toolgate_models.m", false},
			{true, "$KV.toolgate_budgets.k", true},
			{true, "$KV.toolgate_approvals.k", true},
			{true, "$KV.toolgate_settings.k", true},
			{true, "tool.svc.approval", false},
			{true, "tool.svc.tools.register", false},
			{true, "tool.svc.demo.status", false},
			{true, "tool.svc.policy.push", false},
			{true, "tool.svc.models.stats", false},
			{true, "tool.svc.hooks.push", false},
			{true, "tool.svc.tokens.revoke", false},
			{true, "tool.svc.breakers.set", false},
			{true, "tool.svc.models.register", false},
			{true, "$SRV.PING", false},
			{true, "toolgate.cancel.demo.x", false},
			{true, "$KV.toolgate_toolstats.echo.w1", true},
			{true, "$KV.toolgate_modelstats.gpt-small.coding.w1_7", true},
			{true, "$KV.toolgate_capabilities.k", false},
			{false, "toolgate.pipe.>", true},
			{false, "toolgate.cancel.>", true},
			{false, "tool.svc.approval", false},
			{false, "tool.svc.>", false},
			{false, "$SRV.>", false},
		}},
		{"control", Identity{Role: RoleControl, Name: "c"}, AccountToolgate, []check{
			{true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_PIPELINE", false},
			{true, "toolgate.pipe.authorize.normal.demo", true},
			{true, "toolgate.pipe.audit.high.demo", true},
			{true, "toolgate.pipe.route.normal.demo", false},
			{true, "toolgate.pipe.execute.normal.demo", false},
			{true, "toolgate.pipe.verify.normal.demo", false},
			{true, "tool.result.demo.x", false},
			{true, "audit.demo.tool.approval.granted", true},
			{true, "toolgate.cancel.demo.x", true},
			{true, "$KV.toolgate_tools.echo", true},
			{true, "$KV.toolgate_capabilities.k", true},
			{true, "$KV.toolgate_hooks.acme", true},
			{true, "$KV.toolgate_approvals.k", true},
			{true, "$KV.toolgate_invocations.k", true},
			{true, "$KV.toolgate_budgets.k", false},
			{true, "$KV.toolgate_ratelimits.k", false},
			{true, "$KV.toolgate_checkpoints.k", false},
			{true, "$KV.toolgate_breakers.k", true},
			{true, "$KV.toolgate_policies.active", true},
			{true, "$KV.toolgate_revocations.x", true},
			{true, "$KV.toolgate_models.m", true},
			{true, "tool.svc.policy.push", true},
			{true, "$KV.toolgate_modelstats.m.coding.w1_7", false},
			{true, "$JS.API.STREAM.DELETE.AUDIT", false},
			{true, "$JS.API.STREAM.PURGE.KV_toolgate_tools", false},
			{false, "tool.svc.>", true},
			{false, "$SRV.>", true},
			{false, "toolgate.pipe.>", false},
		}},
		{"operator", Identity{Role: RoleOperator, Name: "o"}, AccountToolgate, []check{
			{true, "$JS.API.STREAM.DELETE.AUDIT", true},
			{true, "$KV.toolgate_revocations.x", true},
			{true, "$KV.toolgate_hooks.x", true},
			{true, "tool.svc.approval", true},
			{true, "tool.svc.policy.push", true},
			{true, "tool.svc.policy.get", true},
			{true, "tool.svc.hooks.push", true},
			{true, "tool.svc.hooks.list", true},
			{true, "tool.svc.hooks.delete", true},
			{true, "tool.svc.tokens.revoke", true},
			{true, "tool.svc.breakers.list", true},
			{true, "tool.svc.breakers.set", true},
			{true, "tool.svc.models.register", true},
			{true, "tool.svc.models.list", true},
			{true, "tool.svc.models.delete", true},
			{true, "tool.svc.models.policy", true},
			{false, ">", true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := GrantFor(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if g.Account != tc.account {
				t.Errorf("account %s, want %s", g.Account, tc.account)
			}
			for _, c := range tc.checks {
				perm := g.Permissions.Sub
				if c.pub {
					perm = g.Permissions.Pub
				}
				if got := allows(perm, c.subject); got != c.allowed {
					t.Errorf("pub=%v %s: allowed=%v, want %v", c.pub, c.subject, got, c.allowed)
				}
			}
		})
	}
}

func TestGrantForRefuses(t *testing.T) {
	for _, id := range []Identity{
		{Role: RoleAgent, Tenant: "", TokenID: "j"},
		{Role: RoleAgent, Tenant: "a.b", TokenID: "j"},
		{Role: RoleAgent, Tenant: "*", TokenID: "j"},
		{Role: RoleAgent, Tenant: ">", TokenID: "j"},
		{Role: RoleAgent, Tenant: "_system", TokenID: "j"},
		{Role: RoleAgent, Tenant: "demo"},
		{Role: "root"},
	} {
		if _, err := GrantFor(id); !errors.Is(err, ErrBadIdentity) {
			t.Errorf("%+v: err %v, want ErrBadIdentity", id, err)
		}
	}
}

func TestUserNameRoundTrip(t *testing.T) {
	for _, id := range []Identity{
		{Role: RoleAgent, Tenant: "demo", TokenID: "j-1"},
		{Role: RoleWorker, Name: "local"},
		{Role: RoleControl, Name: "local"},
		{Role: RoleOperator, Name: "alice"},
	} {
		got, err := ParseUserName(id.UserName())
		if err != nil {
			t.Fatal(err)
		}
		if got.Role != id.Role || got.Tenant != id.Tenant || got.TokenID != id.TokenID || (id.Role != RoleAgent && got.Name != id.Name) {
			t.Errorf("%+v -> %q -> %+v", id, id.UserName(), got)
		}
	}
	for _, s := range []string{"", "agent", "agent:demo", "root:x", "worker:"} {
		if _, err := ParseUserName(s); err == nil {
			t.Errorf("%q parsed", s)
		}
	}
}

func TestInboxPrefixEncodesTokenID(t *testing.T) {
	if got := InboxPrefix("demo", "a.b*"); got != "_INBOX.demo.a=2Eb=2A" {
		t.Errorf("got %s", got)
	}
}

// TestBucketNames: the bucket names the roles grant are kvstore's.
func TestBucketNames(t *testing.T) {
	for mine, theirs := range map[string]string{
		bucketTools: kvstore.BucketTools, bucketPolicies: kvstore.BucketPolicies, bucketRevocations: kvstore.BucketRevocations,
		bucketInvocations: kvstore.BucketInvocations, bucketApprovals: kvstore.BucketApprovals, bucketBudgets: kvstore.BucketBudgets,
		bucketRateLimits: kvstore.BucketRateLimits, bucketIdempotency: kvstore.BucketIdempotency,
		bucketCheckpoints: kvstore.BucketCheckpoints, bucketBreakers: kvstore.BucketBreakers,
		bucketToolStats: kvstore.BucketToolStats, bucketModelStats: kvstore.BucketModelStats, bucketCapabilities: kvstore.BucketCapabilities, bucketHooks: kvstore.BucketHooks,
	} {
		if mine != theirs {
			t.Errorf("busauth grants bucket %q, kvstore names it %q", mine, theirs)
		}
	}
}
