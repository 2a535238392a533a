package busauth

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
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
	agent := Identity{Role: RoleAgent, Tenant: "demo", TokenID: "tok-1", Name: "did:agent:a"}
	reader := Identity{Role: RoleAgent, Tenant: "demo", TokenID: "tok-2", Name: "did:agent:r", TenantReader: true}
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
		{"agent", agent, TenantAccount("demo"), []check{
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
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.did=3Aagent=3Aa.x", true},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.did=3Aagent=3Ab.x", false},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.x", false},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.other.did=3Aagent=3Aa.x", false},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS", false},
			{true, "$JS.API.STREAM.DELETE.AUDIT", false},
			{true, "$JS.API.CONSUMER.CREATE.AUDIT.x.audit.demo.>", false},
			{true, "$KV.toolgate_revocations.x", false},
			{false, "tool.result.demo.did=3Aagent=3Aa.*", true},
			{false, "tool.result.demo.did=3Aagent=3Aa.abc", true},
			{false, "tool.result.demo.did=3Aagent=3Ab.abc", false},
			{false, "tool.result.demo.*.abc", false},
			{false, "tool.result.demo.>", false},
			{false, "audit.demo.>", false},
			{false, "audit.demo.tool.succeeded", false},
			{false, "tool.result.other.>", false},
			{false, "audit.>", false},
			{false, "_INBOX.demo.tok-1.>", true},
			{false, "_INBOX.demo.>", false},
			{false, "_INBOX.>", false},
			{false, "toolgate.pipe.>", false},
		}},
		{"tenant reader", reader, TenantAccount("demo"), []check{
			{true, "tool.invoke.demo", true},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.demo.did=3Aagent=3Aa.x", true},
			{true, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.other.did=3Aagent=3Aa.x", false},
			{false, "tool.result.demo.*.*", true},
			{false, "tool.result.demo.>", true},
			{false, "tool.result.demo.did=3Aagent=3Aa.abc", true},
			{false, "audit.demo.>", true},
			{false, "tool.result.other.>", false},
			{false, "audit.other.>", false},
			{false, "_INBOX.demo.tok-2.>", true},
		}},
		{"control", Identity{Role: RoleControl, Name: "c"}, AccountToolgate, []check{
			{true, "toolgate.pipe.authorize.normal.demo", true},
			{true, "toolgate.pipe.audit.high.demo", true},
			{true, "toolgate.pipe.route.normal.demo", false},
			{true, "toolgate.pipe.execute.normal.demo", false},
			{true, "toolgate.pipe.verify.normal.demo", false},
			{true, "tool.result.demo.x", false},
			{true, "audit.demo.tool.approval.granted", false},
			{true, "toolgate.relay.audit.demo.tool.approval.granted", true},
			{true, "toolgate.cancel.demo.x", true},
			{true, "$KV.toolgate_tools.echo", true},
			{true, "$KV.toolgate_capabilities.k", true},
			{true, "$KV.toolgate_hooks.acme", true},
			{true, "$KV.toolgate_approvals.k", true},
			{true, "$KV.toolgate_invocations.k", true},
			{true, "$KV.toolgate_budgets.k", false},
			{true, "$KV.toolgate_ratelimits.k", false},
			{true, "$KV.toolgate_checkpoints.k", true}, // the checkpoints endpoints list and delete them
			{true, "$KV.toolgate_breakers.k", true},
			{true, "$KV.toolgate_policies.active", true},
			{true, "$KV.toolgate_revocations.x", true},
			{true, "$KV.toolgate_models.m", true},
			{true, "tool.svc.policy.push", false},
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
		{Role: RoleAgent, Tenant: "demo", TokenID: "j-1", Name: "did:example:a"},
		{Role: RoleAgent, Tenant: "demo", TokenID: "j:2", Name: "did:example:r", TenantReader: true},
		{Role: RoleExecute, Name: "local"},
		{Role: RoleControl, Name: "local"},
		{Role: RoleOperator, Name: "alice"},
	} {
		got, err := ParseUserName(id.UserName())
		if err != nil {
			t.Fatal(err)
		}
		if got.Role != id.Role || got.Tenant != id.Tenant || got.TokenID != id.TokenID || got.Name != id.Name || got.TenantReader != id.TenantReader {
			t.Errorf("%+v -> %q -> %+v", id, id.UserName(), got)
		}
	}
	for _, s := range []string{"", "agent", "agent:demo", "agent:demo:j-1", "agent:demo:j-1:a:admin", "agent:demo:j:1:a", "root:x", "worker:"} {
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

// TestRolesLeastPrivilege holds every role of account TOOLGATE to the
// rights its work needs, family by family, written out here by hand (not
// derived from Rights): a right added to a role fails it until the
// expectation is changed on purpose.
func TestRolesLeastPrivilege(t *testing.T) {
	type fam struct {
		pub     bool
		subject string
	}
	// Every family a leaked credential could use, with a concrete subject.
	families := map[string]fam{
		"create a stream (republish)":      {true, "$JS.API.STREAM.CREATE.EVIL"},
		"update a stream":                  {true, "$JS.API.STREAM.UPDATE.AUDIT"},
		"delete a stream":                  {true, "$JS.API.STREAM.DELETE.AUDIT"},
		"purge a stream":                   {true, "$JS.API.STREAM.PURGE.KV_toolgate_revocations"},
		"create a consumer (deliver subj)": {true, "$JS.API.CONSUMER.CREATE.KV_toolgate_tools"},
		"create a named consumer":          {true, "$JS.API.CONSUMER.CREATE.TOOLGATE_PIPELINE.evil.toolgate.pipe.>"},
		"create a durable":                 {true, "$JS.API.CONSUMER.DURABLE.CREATE.TOOLGATE_PIPELINE.evil"},
		"delete a stage consumer":          {true, "$JS.API.CONSUMER.DELETE.TOOLGATE_PIPELINE.execute-normal"},
		"delete an audit event":            {true, "$JS.API.STREAM.MSG.DELETE.AUDIT"},
		"delete an invocation waiting":     {true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_INVOKE"},
		"delete a hand-off":                {true, "$JS.API.STREAM.MSG.DELETE.TOOLGATE_PIPELINE"},
		"read raw invocations":             {true, "$JS.API.STREAM.MSG.GET.TOOLGATE_INVOKE"},
		"pull validate's input":            {true, "$JS.API.CONSUMER.MSG.NEXT.TOOLGATE_INVOKE.validate"},
		"pull authorize's input":           {true, "$JS.API.CONSUMER.MSG.NEXT.TOOLGATE_PIPELINE.authorize-normal"},
		"pull execute's input":             {true, "$JS.API.CONSUMER.MSG.NEXT.TOOLGATE_PIPELINE.execute-high"},
		"pull audit's input":               {true, "$JS.API.CONSUMER.MSG.NEXT.TOOLGATE_PIPELINE.audit-low"},
		"hand to authorize":                {true, "toolgate.pipe.authorize.normal.demo"},
		"hand to route":                    {true, "toolgate.pipe.route.normal.demo"},
		"hand to execute":                  {true, "toolgate.pipe.execute.normal.demo"},
		"hand to verify":                   {true, "toolgate.pipe.verify.normal.demo"},
		"hand to audit":                    {true, "toolgate.pipe.audit.normal.demo"},
		"invoke for a tenant":              {true, "tool.invoke.demo"},
		"keep a dead letter":               {true, "toolgate.deadletter.demo.x"},
		"publish a shadow divergence":      {true, "audit.demo.policy.shadow.diverged"},
		"emit a shadow divergence":         {true, "toolgate.relay.audit.demo.policy.shadow.diverged"},
		"read dead letters":                {true, "$JS.API.DIRECT.GET.TOOLGATE_DEADLETTER"},
		"publish a result":                 {true, "tool.result.demo.x"},
		"publish a terminal audit event":   {true, "audit.demo.tool.succeeded"},
		"publish tool.invoked":             {true, "audit.demo.tool.invoked"},
		"publish a poison event":           {true, "audit.demo.pipeline.poison"},
		"publish a breaker transition":     {true, "audit._system.circuit.opened"},
		"publish an admin event":           {true, "audit._system.admin.policy.pushed"},
		"publish an audit checkpoint":      {true, "toolgate.auditchain.checkpoint"},
		"emit a result":                    {true, "toolgate.relay.tool.result.demo.x"},
		"emit a terminal audit event":      {true, "toolgate.relay.audit.demo.tool.succeeded"},
		"emit tool.invoked":                {true, "toolgate.relay.audit.demo.tool.invoked"},
		"emit a poison event":              {true, "toolgate.relay.audit.demo.pipeline.poison"},
		"emit a breaker transition":        {true, "toolgate.relay.audit._system.circuit.opened"},
		"emit an admin event":              {true, "toolgate.relay.audit._system.admin.policy.pushed"},
		"emit an approval request":         {true, "toolgate.relay.audit.demo.tool.approval.requested"},
		"pull the relay":                   {true, "$JS.API.CONSUMER.MSG.NEXT.TOOLGATE_RELAY.audit-relay"},
		"read audit events by sequence":    {true, "$JS.API.DIRECT.GET.AUDIT"},
		"get one audit event":              {true, "$JS.API.STREAM.MSG.GET.AUDIT"},
		"read audit checkpoints":           {true, "$JS.API.STREAM.MSG.GET.AUDIT_CHAIN"},
		"read audit events as they come":   {true, "$JS.API.CONSUMER.CREATE.AUDIT"},
		"announce a cancel":                {true, "toolgate.cancel.demo.x"},
		"forge a watched change":           {true, "toolgate.kv.toolgate_policies.bundle"},
		"write tools":                      {true, "$KV.toolgate_tools.echo"},
		"write policies":                   {true, "$KV.toolgate_policies.bundle"},
		"write revocations":                {true, "$KV.toolgate_revocations.x"},
		"write hooks":                      {true, "$KV.toolgate_hooks.demo"},
		"write models":                     {true, "$KV.toolgate_models.m"},
		"write approvals":                  {true, "$KV.toolgate_approvals.demo.x"},
		"write status records":             {true, "$KV.toolgate_invocations.demo.x"},
		"write budgets":                    {true, "$KV.toolgate_budgets.demo.s"},
		"write rate limits":                {true, "$KV.toolgate_ratelimits.demo.echo"},
		"write breakers":                   {true, "$KV.toolgate_breakers.echo"},
		"write checkpoints":                {true, "$KV.toolgate_checkpoints.demo.x"},
		"write idempotency keys":           {true, "$KV.toolgate_idempotency.demo.k"},
		"write tool statistics":            {true, "$KV.toolgate_toolstats.echo.w"},
		"write model statistics":           {true, "$KV.toolgate_modelstats.m.t.w"},
		"write capability requests":        {true, "$KV.toolgate_capabilities.demo.r"},
		"write security settings":          {true, "$KV.toolgate_settings.authorize"},
		"call an operator endpoint":        {true, "tool.svc.policy.push"},
		"register a tool":                  {true, "tool.svc.tools.register"},
		"serve the control endpoints":      {false, "tool.svc.tools.register"},
		"hear cancels":                     {false, "toolgate.cancel.demo.x"},
		"read the pipeline live":           {false, "toolgate.pipe.>"},
		"read results live":                {false, "tool.result.>"},
		"read another role's replies":      {false, "_INBOX.authorize.x"},
		"read every reply":                 {false, "_INBOX.>"},
		"watch policies":                   {false, "toolgate.kv.toolgate_policies.>"},
		"watch tools":                      {false, "toolgate.kv.toolgate_tools.>"},
	}
	common := []string{}
	allowed := map[Role][]string{
		RoleValidate: {"pull validate's input", "read raw invocations", "delete an invocation waiting", "hand to authorize",
			"hand to audit", "emit a poison event", "emit a result", "write status records", "watch tools"},
		RoleAuthorize: {"pull authorize's input", "delete a hand-off", "hand to route", "hand to audit", "emit a poison event",
			"write status records", "write approvals", "write budgets", "write security settings", "watch tools", "watch policies",
			"emit an approval request", "emit a shadow divergence"},
		RoleRoute: {"delete a hand-off", "hand to execute", "hand to audit", "emit a poison event", "write rate limits", "watch tools"},
		RoleExecute: {"pull execute's input", "delete a hand-off", "hand to verify", "hand to audit", "emit a poison event",
			"emit tool.invoked", "emit a breaker transition", "hear cancels", "write status records", "write breakers",
			"write checkpoints", "write idempotency keys", "write model statistics", "write security settings", "watch tools",
			"watch policies"},
		RoleVerify: {"delete a hand-off", "hand to audit", "emit a poison event", "watch tools"},
		RoleAudit: {"pull audit's input", "delete a hand-off", "delete an invocation waiting", "invoke for a tenant", "publish a result", "publish a terminal audit event",
			"publish tool.invoked", "publish a poison event", "publish a breaker transition", "publish an admin event",
			"publish an audit checkpoint", "keep a dead letter", "publish a shadow divergence", "read audit events by sequence", "get one audit event", "read audit checkpoints",
			"write status records", "write budgets", "write tool statistics", "watch tools", "pull the relay"},
		RoleControl: {"hand to authorize", "invoke for a tenant", "read dead letters", "read audit events by sequence", "get one audit event", "read audit checkpoints", "hand to audit", "announce a cancel", "emit an admin event",
			"emit a breaker transition", "write tools", "write policies", "write revocations", "write hooks", "write models",
			"write approvals", "write status records", "write breakers", "write capability requests", "write checkpoints", "serve the control endpoints",
			"watch tools", "watch policies", "emit an approval request"},
	}
	for role, want := range allowed {
		t.Run(string(role), func(t *testing.T) {
			g, err := GrantFor(Identity{Role: role, Name: "local"})
			if err != nil {
				t.Fatal(err)
			}
			if g.Account != AccountToolgate {
				t.Errorf("account %s", g.Account)
			}
			for name, f := range families {
				perm := g.Permissions.Sub
				if f.pub {
					perm = g.Permissions.Pub
				}
				exp := slices.Contains(want, name) || slices.Contains(common, name)
				subj := f.subject
				if name == "read another role's replies" && role == RoleAuthorize {
					subj = RoleInbox(RoleAudit) + ".x"
				}
				if got := allows(perm, subj); got != exp {
					t.Errorf("%s (%s): allowed=%v, want %v", name, f.subject, got, exp)
				}
			}
			if !allows(g.Permissions.Sub, RoleInbox(role)+".x") {
				t.Errorf("its own inbox %s is refused", RoleInbox(role))
			}
		})
	}
	if len(allowed) != len(Rights) {
		t.Errorf("%d roles have rights, %d are held to them here", len(Rights), len(allowed))
	}
}

// TestRoleTableInDocs: docs/security.md shows the rights the code grants.
func TestRoleTableInDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	const begin, end = "<!-- role table: generated from busauth.Rights -->\n", "<!-- end of role table -->"
	i, j := strings.Index(page, begin), strings.Index(page, end)
	if i < 0 || j < i {
		t.Fatalf("docs/security.md has no role table between %q and %q", begin, end)
	}
	if got, want := page[i+len(begin):j], RoleTable(); got != want {
		t.Errorf("docs/security.md's role table differs from the rights granted; it should read:\n%s", want)
	}
}
