package main

import (
	"errors"
	"path/filepath"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
)

// explainRefusal turns the bus's terse refusal of a connection
// ("Authorization Violation") into what happened and what to do, with an
// E-code its exit status follows (refusalCode). Other errors pass through.
func (a *app) explainRefusal(err error) error {
	used := a.conn.Identity().String()
	switch {
	case errors.Is(err, nats.ErrAuthExpired):
		return api.WrapError(err, api.PermissionDenied, api.ETokenExpired,
			"the bus closed the connection: its credentials (%s) expired; %s", used, a.renewHint())
	case errors.Is(err, nats.ErrAuthRevoked):
		return api.WrapError(err, api.PermissionDenied, api.ETokenRevoked,
			"the bus closed the connection: its credentials (%s) were revoked; %s", used, a.renewHint())
	case !errors.Is(err, nats.ErrAuthorization):
		return err
	}
	if a.asAgent() {
		var c token.Claims
		if _, _, perr := jwt.NewParser().ParseUnverified(a.conn.Token, &c); perr == nil && c.ExpiresAt != nil && time.Now().After(c.ExpiresAt.Time) {
			return api.WrapError(err, api.PermissionDenied, api.ETokenExpired,
				"the bus refused %s: it expired at %s; ask whoever issued it for a new one (toolgate token mint)", used, c.ExpiresAt.UTC().Format(time.RFC3339))
		}
		if _, perr := api.ReadTokenClaims(a.conn.Token); perr != nil {
			return malformedToken(err, used, perr)
		}
		return api.WrapError(err, api.PermissionDenied, api.EBusRefused,
			"the bus refused %s: it is revoked, malformed, or not signed by a key this deployment trusts; check it with `toolgate token inspect`, or ask for a new one", used)
	}
	if a.conn.Identity().Kind == "none" {
		hint := ""
		if p := filepath.Join(a.data, busauth.DirName, busauth.OperatorCredsFile); fileExists(p) {
			hint = " (a local serve's are in " + filepath.Dir(p) + ": --creds " + p + ")"
		}
		return api.WrapError(err, api.PermissionDenied, api.EBusRefused,
			"the bus admits no anonymous connections: give an agent's capability token (--token, TOOLGATE_TOKEN) or operator credentials (--creds FILE, or NATS_NKEY and NATS_TOKEN as serve prints them)%s", hint)
	}
	return api.WrapError(err, api.PermissionDenied, api.EBusRefused,
		"the bus refused %s: expired, revoked, or not issued by this deployment; issue new ones with `toolgate creds issue` where the deployment's keys are (a local serve's: `toolgate creds rotate`, then export them again)", used)
}

func (a *app) renewHint() string {
	if a.asAgent() {
		return "ask whoever issued the capability token for a new one"
	}
	return "issue new credentials with `toolgate creds issue`"
}

// checkAgentTenant refuses, before connecting, a tenant an agent's token
// cannot act for: the bus would refuse every request for it.
func (a *app) checkAgentTenant(tenant string) error {
	if !a.asAgent() {
		return nil
	}
	c, err := api.ReadTokenClaims(a.conn.Token)
	if err != nil || c.TenantID == "" || c.TenantID == tenant {
		return nil
	}
	return api.NewError(api.PermissionDenied, api.ETenantMismatch,
		"the capability token is for tenant %s, and an agent acts only for its own tenant: drop --tenant %s (or use that tenant's token)", c.TenantID, tenant)
}

// malformedToken is the one refusal of a capability token that is no JWT,
// whether the command line sees it first or the bus refuses it.
func malformedToken(err error, used string, cause error) error {
	return api.WrapError(err, api.PermissionDenied, api.EBusRefused,
		"the bus refuses %s: it is malformed (%v); check it with `toolgate token inspect`, or ask for a new one", used, cause)
}
