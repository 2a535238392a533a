package busauth

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// InProcess authenticates the clients of an embedded server inside the
// server (nats-server's custom client authentication) with the callout's
// own mapping: Callout.Authorize decides who a connection is and GrantFor
// what it may do, exactly as for an external server. What it saves is the
// callout's round trip: no authorization request or response JWTs are
// built, signed, sent and verified, so a CONNECT costs the proof of the
// credentials (one signature verification) and nothing else.
//
// A tenant's account (TenantAccount) is created, with its imports, when the
// tenant's first agent connects, unless the configuration declares it.
//
// Lifecycle: NewInProcess, set it as the server's authentication
// (ServerSettings.InProcess), then Bind the server before it starts; until
// bound every connection is refused.
type InProcess struct {
	c       *Callout
	sysUser string
	srv     atomic.Pointer[server.Server]
	tenants tenantAccounts

	mu    sync.Mutex
	leafs map[string][]uint64 // site -> the ids of the leaf links it was admitted on
}

// NewInProcess returns an in-process authenticator. cfg is a callout's; a
// nil Kicker closes revoked connections on the bound server directly.
func NewInProcess(cfg CalloutConfig) (*InProcess, error) {
	if cfg.Keys == nil {
		return nil, errors.New("busauth: in-process authentication needs keys")
	}
	a := &InProcess{sysUser: mustPublic(cfg.Keys.SystemUser)}
	if cfg.Kicker == nil {
		cfg.Kicker = a
	}
	c, err := NewCallout(cfg)
	if err != nil {
		return nil, err
	}
	a.c = c
	return a, nil
}

// Callout is the mapping and revocation tracking a shares with the callout
// service: call its Revoke when a token is revoked.
func (a *InProcess) Callout() *Callout { return a.c }

// Bind names the server a authenticates for. Call it before Start.
func (a *InProcess) Bind(s *server.Server) { a.srv.Store(s) }

// Kick implements Kicker on the bound server.
func (a *InProcess) Kick(_ context.Context, serverID string, clientID uint64) error {
	s := a.srv.Load()
	if s == nil || s.ID() != serverID {
		return fmt.Errorf("kicking client %d: server %s is not this process's", clientID, serverID)
	}
	if err := s.DisconnectClientByID(clientID); err != nil {
		return errNoSuchClient
	}
	return nil
}

// Check implements server.Authentication. It runs in the connecting
// client's goroutine, before the server reads anything else from it.
func (a *InProcess) Check(ca server.ClientAuthentication) bool {
	s := a.srv.Load()
	if s == nil || (ca.Kind() != server.CLIENT && ca.Kind() != server.LEAF) {
		return false
	}
	leaf := ca.Kind() == server.LEAF
	o := ca.GetOpts()
	nonce := ca.GetNonce()
	if o.Nkey != "" && o.Nkey == a.sysUser {
		// The system account's user (the kicker, `nats server` requests).
		if verifyNonce(o.Nkey, nonce, o.Sig) != nil {
			return false
		}
		acc, err := s.LookupAccount(AccountSystem)
		if err != nil {
			return false
		}
		ca.RegisterUser(&server.User{Username: "system", Account: acc})
		return true
	}
	req := &jwt.AuthorizationRequestClaims{}
	req.Server.ID = s.ID()
	req.ClientInformation = jwt.ClientInformation{ID: ca.GetID(), Nonce: string(nonce), Kind: "Client", Type: "nats"}
	if leaf {
		req.ClientInformation.Kind = "Leafnode"
	}
	if addr := ca.RemoteAddress(); addr != nil {
		req.ClientInformation.Host = addr.String()
	}
	req.ConnectOptions = jwt.ConnectOptions{
		JWT: o.JWT, Nkey: o.Nkey, SignedNonce: o.Sig, Token: o.Token,
		Username: o.Username, Password: o.Password, Name: o.Name,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	id, err := a.c.Authorize(ctx, req)
	var g Grant
	if err == nil {
		g, err = GrantFor(id)
	}
	// A site's credentials admit its leaf node and nothing else; no other
	// credentials admit a leaf node.
	if err == nil && leaf != (id.Role == RoleSite) {
		err = fmt.Errorf("%w: %s credentials on a %s connection", ErrWrongConnection, id.Role, map[bool]string{true: "leaf-node", false: "client"}[leaf])
	}
	var acc *server.Account
	switch {
	case err != nil:
	case id.Role == RoleAgent:
		// The tenant's first agent creates its account.
		acc, err = a.tenants.get(s, id.Tenant)
	default:
		acc, err = s.LookupAccount(g.Account)
	}
	if err != nil {
		a.c.refuse(ctx, req, id, err)
		return false
	}
	u := &server.User{Username: id.UserName(), Account: acc, Permissions: serverPermissions(&g.Permissions)}
	if !id.Expires.IsZero() {
		u.ConnectionDeadline = id.Expires
	}
	ca.RegisterUser(u)
	if id.Role == RoleAgent {
		a.c.track(id, req.Server.ID, req.ClientInformation.ID)
	}
	if leaf {
		a.mu.Lock()
		if a.leafs == nil {
			a.leafs = map[string][]uint64{}
		}
		// Forget the links that ended: a site redials after each cut.
		a.leafs[id.Name] = append(slices.DeleteFunc(a.leafs[id.Name], func(cid uint64) bool { return s.GetLeafNode(cid) == nil }), ca.GetID())
		a.mu.Unlock()
	}
	return true
}

// CutSite closes every leaf link site was admitted on, and returns how
// many were open: once a site is removed (or declared again) its links
// end, and its credentials are refused when they dial again
// (CalloutConfig.SiteUser).
func (a *InProcess) CutSite(site string) int {
	a.mu.Lock()
	ids := a.leafs[site]
	delete(a.leafs, site)
	a.mu.Unlock()
	s, n := a.srv.Load(), 0
	for _, id := range ids {
		if s != nil && s.DisconnectClientByID(id) == nil {
			n++
		}
	}
	return n
}

// verifyNonce checks that sig (base64) is nkey's signature of nonce: the
// holder of credentials proves it has their seed.
func verifyNonce(nkey string, nonce []byte, sig string) error {
	if len(nonce) == 0 || sig == "" {
		return fmt.Errorf("%w: no nonce signature in the connect", ErrBadNonce)
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		if raw, err = base64.StdEncoding.DecodeString(sig); err != nil {
			return fmt.Errorf("%w: signature is not base64", ErrBadNonce)
		}
	}
	kp, err := nkeys.FromPublicKey(nkey)
	if err != nil {
		return fmt.Errorf("%w: user JWT subject: %v", ErrBadToken, err)
	}
	if err := kp.Verify(nonce, raw); err != nil {
		return fmt.Errorf("%w: %v", ErrBadNonce, err)
	}
	return nil
}

// serverPermissions is the server's reading of a user JWT's permissions
// (nats-server's buildPermissionsFromJwt), so that a grant means the same
// in-process as through the callout.
func serverPermissions(p *jwt.Permissions) *server.Permissions {
	out := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: p.Pub.Allow, Deny: p.Pub.Deny},
		Subscribe: &server.SubjectPermission{Allow: p.Sub.Allow, Deny: p.Sub.Deny},
	}
	if len(p.Pub.Allow) == 0 && len(p.Pub.Deny) == 0 {
		out.Publish = nil
	}
	if len(p.Sub.Allow) == 0 && len(p.Sub.Deny) == 0 {
		out.Subscribe = nil
	}
	if p.Resp != nil {
		out.Response = &server.ResponsePermission{MaxMsgs: p.Resp.MaxMsgs, Expires: p.Resp.Expires}
		if out.Publish == nil {
			out.Publish = &server.SubjectPermission{}
		}
		if out.Publish.Allow == nil {
			// An allow-responses grant alone must not leave publishing open.
			out.Publish.Allow = []string{}
		}
		if out.Response.MaxMsgs == 0 {
			out.Response.MaxMsgs = server.DEFAULT_ALLOW_RESPONSE_MAX_MSGS
		}
		if out.Response.Expires == 0 {
			out.Response.Expires = server.DEFAULT_ALLOW_RESPONSE_EXPIRATION
		}
	}
	return out
}
