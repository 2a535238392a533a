package busauth

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
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

// TestSiteBundleKey: a site's bundle holds the site's own signing key and
// no stage's; the hub's hops.pub lists its public half under the site's
// role, and declaring the site again replaces it, so the old bundle's key
// is no longer trusted.
func TestSiteBundleKey(t *testing.T) {
	hub := t.TempDir()
	if _, err := writeCredentials(hub, false); err != nil {
		t.Fatal(err)
	}
	bundleKey := func(out string) ed25519.PublicKey {
		t.Helper()
		if _, err := WriteSiteBundle(hub, "lab-eu", out); err != nil {
			t.Fatal(err)
		}
		for _, r := range SigningRoles {
			if _, err := os.Stat(filepath.Join(out, DirName, HopKeyFile(r))); err == nil {
				t.Fatalf("the bundle holds %s's signing key", r)
			}
		}
		k, err := LoadHopKey(out, SiteRole("lab-eu"))
		if err != nil {
			t.Fatal(err)
		}
		return k.Public().(ed25519.PublicKey)
	}
	first := bundleKey(filepath.Join(t.TempDir(), "b1"))
	pubs, err := LoadHopPublicKeys(hub)
	if err != nil {
		t.Fatal(err)
	}
	if !pubs[SiteRole("lab-eu")].Equal(first) {
		t.Fatal("the hub's hops.pub does not list the site's key")
	}
	second := bundleKey(filepath.Join(t.TempDir(), "b2"))
	if pubs, err = LoadHopPublicKeys(hub); err != nil {
		t.Fatal(err)
	}
	if first.Equal(second) || !pubs[SiteRole("lab-eu")].Equal(second) {
		t.Fatal("declaring the site again kept its old key")
	}
	if site, ok := SiteOfRole(SiteRole("lab-eu")); !ok || site != "lab-eu" {
		t.Fatalf("SiteOfRole: %q %v", site, ok)
	}
	for _, r := range []Role{RoleExecute, "execute@", "execute@a.b", "verify@lab-eu"} {
		if _, ok := SiteOfRole(r); ok {
			t.Errorf("%q is a site's role", r)
		}
	}
	if !MayPublish(SiteRole("lab-eu"), subjects.Pipe(subjects.Verify, "normal", "acme")) ||
		MayPublish(SiteRole("lab-eu"), subjects.AuditEvent("acme", "tool.succeeded")) {
		t.Error("a site's role publishes other than execute's hand-offs")
	}
}
