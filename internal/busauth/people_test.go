package busauth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/subjects"
)

// TestRolePeopleGrants: each person's role gets its own endpoints and
// nothing else: no bucket, no consumer, no stream change, no write of the
// trail; and neither does the operator write the trail.
func TestRolePeopleGrants(t *testing.T) {
	never := []string{subjects.AuditTenant("demo") + ".x", subjects.Result("demo", "agent", "x"), "$JS.API.CONSUMER.CREATE.AUDIT.x",
		"$JS.API.STREAM.DELETE.AUDIT", "$JS.API.DIRECT.GET.KV_toolgate_policies", subjects.BucketKeys(subjects.BucketPolicies),
		subjects.PipeStage(subjects.Execute), subjects.Invoke("demo")}
	cases := map[Role]struct{ may, mayNot []string }{
		RoleApprover: {
			may: []string{subjects.SvcApproval, subjects.SvcApprovalsList, subjects.TenantSvc("demo", subjects.SvcApprovalsGet),
				subjects.TenantSvc("demo", subjects.SvcAuditHistory), subjects.DirectGet(subjects.StreamAudit)},
			mayNot: []string{subjects.SvcPolicyPush, subjects.SvcToolsRegister, subjects.SvcRedriveRun, subjects.SvcTokensRevoke},
		},
		RoleAuditor: {
			may:    []string{subjects.TenantSvc("demo", subjects.SvcAuditHistory), subjects.DirectGet(subjects.StreamAuditChain)},
			mayNot: []string{subjects.SvcApproval, subjects.SvcPolicyPush, subjects.SvcBreakersSet},
		},
		RoleAdmin: {
			may:    []string{subjects.SvcPolicyPush, subjects.SvcToolsRegister, subjects.SvcRedriveRun, subjects.SvcPolicyShadowPromote, subjects.SvcTokensRevoke},
			mayNot: []string{subjects.SvcApproval, subjects.DirectGet(subjects.StreamAudit)},
		},
	}
	for role, c := range cases {
		g, err := GrantFor(Identity{Role: role, Name: "pat"})
		if err != nil {
			t.Fatal(err)
		}
		if g.Account != AccountToolgate {
			t.Errorf("%s in account %s", role, g.Account)
		}
		for _, s := range c.may {
			if !allows(g.Permissions.Pub, s) {
				t.Errorf("%s may not publish %s", role, s)
			}
		}
		for _, s := range append(c.mayNot, never...) {
			if allows(g.Permissions.Pub, s) {
				t.Errorf("%s may publish %s", role, s)
			}
		}
		if !allows(g.Permissions.Sub, PersonInbox(role, "pat")+".x") || allows(g.Permissions.Sub, PersonInbox(role, "sam")+".x") {
			t.Errorf("%s: its own inbox only", role)
		}
		if _, err := GrantFor(Identity{Role: role, Name: "a.b"}); err == nil {
			t.Errorf("%s named a.b granted", role)
		}
	}
	op, _ := GrantFor(Identity{Role: RoleOperator, Name: "local"})
	for _, s := range []string{"audit.demo.x", "tool.result.demo.x", "audit._system.audit.recreated"} {
		if allows(op.Permissions.Pub, s) {
			t.Errorf("the operator may publish %s", s)
		}
	}
	if !allows(op.Permissions.Pub, "$JS.API.STREAM.CREATE.AUDIT") {
		t.Error("the operator may no longer make the topology")
	}
}

// TestRoleTableInDocsPeople: docs/security.md shows the people's rights the
// code grants.
func TestRoleTableInDocsPeople(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	const begin, end = "<!-- people's roles: generated from busauth.PeopleRights -->\n", "<!-- end of people's roles -->"
	i, j := strings.Index(page, begin), strings.Index(page, end)
	if i < 0 || j < i {
		t.Fatalf("docs/security.md has no people's role table between %q and %q", begin, end)
	}
	if got, want := page[i+len(begin):j], PeopleTable(); got != want {
		t.Errorf("docs/security.md's people's role table differs from the rights granted; it should read:\n%s", want)
	}
}
