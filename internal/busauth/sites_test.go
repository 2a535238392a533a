package busauth

import (
	"crypto/ed25519"
	"errors"
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
	// Its hand-offs and relays go through its own outbox only, which the
	// hub bounds and forwards: never straight into the pipeline or the
	// relay, and never through another site's outbox.
	verify := subjects.Pipe(subjects.Verify, "normal", "acme")
	relay := subjects.Relay(subjects.AuditEvent("acme", "tool.invoked"))
	if !allows(g.Permissions.Pub, subjects.SiteOut("lab-eu", verify)) || !allows(g.Permissions.Pub, subjects.SiteOut("lab-eu", relay)) {
		t.Error("its outbox is refused")
	}
	for _, s := range []string{verify, relay, subjects.SiteOut("lab-us", verify)} {
		if allows(g.Permissions.Pub, s) {
			t.Errorf("a site's credentials may publish on %s", s)
		}
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
		k, err := NewSiteKeys()
		if err != nil {
			t.Fatal(err)
		}
		tok, err := DeclareSite(hub, "lab-eu", k.User(), k.Signing())
		if err != nil {
			t.Fatal(err)
		}
		files, err := SiteBundleFiles(hub)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := WriteSiteBundle(out, "lab-eu", k, tok, files); err != nil {
			t.Fatal(err)
		}
		for _, r := range SigningRoles {
			if _, err := os.Stat(filepath.Join(out, DirName, HopKeyFile(r))); err == nil {
				t.Fatalf("the bundle holds %s's signing key", r)
			}
		}
		key, err := LoadHopKey(out, SiteRole("lab-eu"))
		if err != nil {
			t.Fatal(err)
		}
		return key.Public().(ed25519.PublicKey)
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

// TestSiteUserRecord: the hub admits a site's credentials only while the
// site is declared with their user: declaring it again refuses the earlier
// ones, removing it refuses all, and a site never declared is refused.
func TestSiteUserRecord(t *testing.T) {
	hub := t.TempDir()
	if _, err := writeCredentials(hub, false); err != nil {
		t.Fatal(err)
	}
	declare := func() *SiteKeys {
		t.Helper()
		k, err := NewSiteKeys()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DeclareSite(hub, "lab-eu", k.User(), k.Signing()); err != nil {
			t.Fatal(err)
		}
		return k
	}
	first := declare()
	if err := CheckSiteUser(hub, "lab-eu", first.User()); err != nil {
		t.Fatalf("the declared site's credentials: %v", err)
	}
	second := declare()
	if err := CheckSiteUser(hub, "lab-eu", first.User()); !errors.Is(err, ErrUnknownSite) {
		t.Errorf("the credentials of a site declared again since: %v, want ErrUnknownSite", err)
	}
	if err := CheckSiteUser(hub, "lab-us", second.User()); !errors.Is(err, ErrUnknownSite) {
		t.Errorf("a site never declared: %v, want ErrUnknownSite", err)
	}
	if _, err := DeclareSite(hub, "lab-us", "not-a-key", second.Signing()); !errors.Is(err, ErrBadIdentity) {
		t.Errorf("a declaration with no user key: %v", err)
	}
	if err := RemoveSite(hub, "lab-eu"); err != nil {
		t.Fatal(err)
	}
	if err := CheckSiteUser(hub, "lab-eu", second.User()); !errors.Is(err, ErrUnknownSite) {
		t.Errorf("a removed site's credentials: %v, want ErrUnknownSite", err)
	}
	if pubs, err := LoadHopPublicKeys(hub); err != nil || pubs[SiteRole("lab-eu")] != nil {
		t.Errorf("a removed site's signing key is still in hops.pub (%v)", err)
	}
	if err := RemoveSite(hub, "lab-eu"); !errors.Is(err, ErrUnknownSite) {
		t.Errorf("removing it twice: %v", err)
	}
}
