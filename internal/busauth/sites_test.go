package busauth

import (
	"testing"

	"github.com/toolgate/toolgate/subjects"
)

// TestSiteGrant: a site's credentials pull from its own execute consumers
// only (by the hub's JetStream domain, as its worker asks across the leaf
// link), hand on to verify, and publish no result or audit event of their
// own; another site's and the hub's execute consumers are out of reach.
func TestSiteGrant(t *testing.T) {
	g, err := GrantFor(Identity{Role: RoleSite, Name: "lab-eu"})
	if err != nil {
		t.Fatal(err)
	}
	if g.Account != AccountToolgate {
		t.Fatalf("account %s", g.Account)
	}
	next := func(in subjects.Input) string {
		return "$JS." + subjects.HubDomain + ".API.CONSUMER.MSG.NEXT." + in.Stream + "." + in.Consumer
	}
	for _, in := range subjects.SiteInputs("lab-eu") {
		if !allows(g.Permissions.Pub, next(in)) {
			t.Errorf("its own consumer %s is refused", in.Consumer)
		}
	}
	refused := []string{subjects.Result("acme", "a", "i"), subjects.AuditEvent("acme", "tool.succeeded"),
		subjects.Relay(subjects.Result("acme", "a", "i")), subjects.Pipe(subjects.Authorize, "normal", "acme")}
	for _, in := range append(subjects.SiteInputs("lab-us"), subjects.Inputs(subjects.Execute)...) {
		refused = append(refused, next(in), "$JS.API.CONSUMER.MSG.NEXT."+in.Stream+"."+in.Consumer)
	}
	for _, s := range refused {
		if allows(g.Permissions.Pub, s) {
			t.Errorf("a site's credentials may publish on %s", s)
		}
	}
	if !allows(g.Permissions.Pub, subjects.Pipe(subjects.Verify, "normal", "acme")) {
		t.Error("its hand-off to verify is refused")
	}
	if allows(g.Permissions.Sub, subjects.SiteInbox("lab-us")+".x") || !allows(g.Permissions.Sub, subjects.SiteInbox("lab-eu")+".x") {
		t.Error("a site reads replies below another site's inbox, or not below its own")
	}
	if _, err := GrantFor(Identity{Role: RoleSite, Name: "a.b"}); err == nil {
		t.Error("a site named a.b was granted")
	}
}
