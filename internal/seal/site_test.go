package seal

import (
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// TestSiteHandOff: a site signs with its own key, which the hub learns
// after it started; verify takes from a site only a call route sent to
// that site, and audit takes a site's ending only with route's custody of
// the call for that site. A site passing for another, or for the hub's
// execute, is refused.
func TestSiteHandOff(t *testing.T) {
	priv, _ := roleKeys(t)
	keys := map[busauth.Role]ed25519.PublicKey{}
	for r, k := range priv {
		keys[r] = k.Public().(ed25519.PublicKey)
	}
	eu, us := busauth.SiteRole("lab-eu"), busauth.SiteRole("lab-us")
	for _, r := range []busauth.Role{eu, us} {
		p, k, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		priv[r] = k
		keys[r] = p
	}
	// The hub's processes started before the sites were declared.
	hub := func(r busauth.Role) (*Messages, *Signer) {
		base := map[busauth.Role]ed25519.PublicKey{}
		for _, sr := range busauth.SigningRoles {
			base[sr] = keys[sr]
		}
		m := NewMessages(base)
		m.LoadSitesFrom(func() (map[busauth.Role]ed25519.PublicKey, error) { return keys, nil })
		return m, m.NewSigner(r, priv[r])
	}
	site := func(r busauth.Role, k ed25519.PrivateKey) *Signer { return NewMessages(keys).NewSigner(r, k) }
	_, route := hub(busauth.RoleRoute)
	verify, _ := hub(busauth.RoleVerify)
	audit, _ := hub(busauth.RoleAudit)
	siteEU, siteUS := site(eu, priv[eu]), site(us, priv[us])

	call := func(to string) *envelope.Invocation {
		inv := &envelope.Invocation{ID: "inv-" + to, Tenant: "acme"}
		inv.Event.Seq = 7
		inv.Route = &envelope.Route{ToolID: "t", Site: to}
		if to != "" {
			inv.Route.SiteBinding = route.SiteBinding(to, inv.Tenant, inv.ID, inv.Event.Seq)
			inv.Custody = route.Custody(busauth.SiteRole(to), inv.Tenant, inv.ID, inv.Event.Seq)
		} else {
			inv.Custody = route.Custody(busauth.RoleExecute, inv.Tenant, inv.ID, inv.Event.Seq)
		}
		return inv
	}
	// A hand-off to verify: signed (MAC) by the site, checked at verify.
	handOff := func(s *Signer, inv *envelope.Invocation) error {
		subject := subjects.Pipe(subjects.Verify, "normal", inv.Tenant)
		h := s.Sign(subject, nil, []byte("{}"))
		sender, err := verify.Sender(subject, h, []byte("{}"))
		if err != nil {
			return err
		}
		if sender != s.role {
			t.Fatalf("sender %s, want %s", sender, s.role)
		}
		return verify.HandOff(sender, inv)
	}
	if err := handOff(siteEU, call("lab-eu")); err != nil {
		t.Fatalf("lab-eu's own call: %v", err)
	}
	refused := func(what string, err error, code string) {
		t.Helper()
		var ae *api.Error
		if !errors.As(err, &ae) || ae.ECode != code {
			t.Fatalf("%s: got %v, want %s", what, err, code)
		}
	}
	refused("lab-eu hands on lab-us's call", handOff(siteEU, call("lab-us")), api.ESiteHandOffRefused)
	refused("lab-eu hands on a hub call", handOff(siteEU, call("")), api.ESiteHandOffRefused)
	relabelled := call("lab-us")
	relabelled.Route.Site = "lab-eu"
	refused("lab-eu relabels lab-us's call", handOff(siteEU, relabelled), api.ESiteHandOffRefused)
	if err := handOff(siteUS, call("lab-us")); err != nil {
		t.Fatalf("lab-us's own call: %v", err)
	}

	// Endings at audit: a site's failure, and verify's ending of a site's
	// call with the site's custody of verify.
	failed := api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "x")
	own := call("lab-eu")
	own.Fail(subjects.Execute, failed)
	if err := audit.Ending(eu, own); err != nil {
		t.Fatalf("lab-eu ends its own call: %v", err)
	}
	for name, inv := range map[string]*envelope.Invocation{"lab-us's": call("lab-us"), "a hub": call("")} {
		inv.Fail(subjects.Execute, failed)
		refused("lab-eu ends "+name+" call", audit.Ending(eu, inv), api.EEndingRefused)
	}
	// The hub's execute ends a site's call whose message reached the
	// delivery limit (the site may not read it by sequence), and no other
	// ending of a site's call.
	exhausted := call("lab-eu")
	exhausted.Fail(subjects.Execute, api.NewError(api.InternalError, api.EDeliveryExhausted, "x"))
	if err := audit.Ending(busauth.RoleExecute, exhausted); err != nil {
		t.Fatalf("the hub's execute ends lab-eu's exhausted call: %v", err)
	}
	// And one that waited for a site since removed.
	stranded := call("lab-eu")
	stranded.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.ESiteRemoved, "x"))
	if err := audit.Ending(busauth.RoleExecute, stranded); err != nil {
		t.Fatalf("the hub's execute ends the removed lab-eu's waiting call: %v", err)
	}
	relabelledRemoved := call("lab-eu")
	relabelledRemoved.Route.Site = "lab-us"
	relabelledRemoved.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.ESiteRemoved, "x"))
	refused("the hub's execute ends lab-eu's call as the removed lab-us's", audit.Ending(busauth.RoleExecute, relabelledRemoved), api.EEndingRefused)
	hubFailed := call("lab-eu")
	hubFailed.Fail(subjects.Execute, failed)
	refused("the hub's execute ends lab-eu's call otherwise", audit.Ending(busauth.RoleExecute, hubFailed), api.EEndingRefused)
	relabelledEnd := call("lab-eu")
	relabelledEnd.Route.Site = "lab-us"
	relabelledEnd.Fail(subjects.Execute, api.NewError(api.InternalError, api.EDeliveryExhausted, "x"))
	refused("the hub's execute ends lab-eu's call as lab-us's", audit.Ending(busauth.RoleExecute, relabelledEnd), api.EEndingRefused)

	viaSite := call("lab-eu")
	viaSite.Custody = siteEU.Custody(busauth.RoleVerify, viaSite.Tenant, viaSite.ID, viaSite.Event.Seq)
	viaSite.Fail(subjects.Verify, failed)
	if err := audit.Ending(busauth.RoleVerify, viaSite); err != nil {
		t.Fatalf("verify ends lab-eu's call: %v", err)
	}
	forged := call("lab-us")
	forged.Custody = siteEU.Custody(busauth.RoleVerify, forged.Tenant, forged.ID, forged.Event.Seq)
	forged.Fail(subjects.Verify, failed)
	refused("verify ends lab-us's call with lab-eu's custody", audit.Ending(busauth.RoleVerify, forged), api.EEndingRefused)

	// lab-eu declared again: a new key, which the hub learns at the
	// first hand-off that its old one does not verify; the old key
	// then signs nothing.
	p, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	keys[eu] = p
	time.Sleep(1100 * time.Millisecond) // the hub reads hops.pub at most once a second
	if err := handOff(site(eu, k), call("lab-eu")); err != nil {
		t.Fatalf("lab-eu's new key: %v", err)
	}
	refused("lab-eu's old key", handOff(siteEU, call("lab-eu")), api.EMessageUnsigned)
	// Audit, in a process of its own, learns the new key from verify's
	// ending of a call of lab-eu's, custody made with it.
	time.Sleep(1100 * time.Millisecond)
	renewed := call("lab-eu")
	renewed.Custody = site(eu, k).Custody(busauth.RoleVerify, renewed.Tenant, renewed.ID, renewed.Event.Seq)
	renewed.Fail(subjects.Verify, failed)
	if err := audit.Ending(busauth.RoleVerify, renewed); err != nil {
		t.Fatalf("verify ends lab-eu's call, custody by its new key: %v", err)
	}
}
