package busauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/subjects"
)

// Why a connection is refused. Every refusal wraps one of these; test with
// errors.Is. The text reaches the server's log and the callout's Auditor;
// the client itself sees only nats.ErrAuthorization ("Authorization
// Violation"): nats-server does not pass the callout's reason to clients.
var (
	ErrNoCredentials = errors.New("no credentials")
	ErrBadToken      = errors.New("invalid token")
	ErrBadSignature  = errors.New("bad signature")
	ErrExpired       = errors.New("credentials expired")
	ErrRevoked       = errors.New("token revoked")
	ErrWrongTenant   = errors.New("tenant not served")
	ErrUnknownIssuer = errors.New("credentials not issued by this deployment")
	ErrBadNonce      = errors.New("nonce signature missing or wrong")
	// ErrWrongConnection: a site's credentials on a client connection,
	// or any other credentials on a leaf-node connection.
	ErrWrongConnection = errors.New("credentials not for this kind of connection")
	// ErrPermission: the server refused an admitted connection a publish
	// or a subscription by its permissions.
	ErrPermission = errors.New("refused by the connection's permissions")
)

// AgentToken is what a verified capability token says about its holder.
type AgentToken struct {
	Tenant  string
	Subject string // the agent (sub, or agent_did)
	ID      string // jti
	// Chain lists the ids of the tokens it was derived from, root first.
	Chain   []string
	Expires time.Time
	// TenantReader: the token's tenant_reader claim, the opt-in to see
	// every call of the tenant, not only the agent's own.
	TenantReader bool
}

// TokenVerifier checks an agent's capability token exactly as the
// authorize stage does: signature with the key its kid names, pinned
// algorithm, issuer and audience, expiry, required claims, and revocation
// of the token and every token of its chain. Its errors wrap ErrExpired,
// ErrRevoked, ErrBadSignature or ErrBadToken so the refusal names the cause.
type TokenVerifier interface {
	VerifyConnectToken(ctx context.Context, raw string) (AgentToken, error)
}

// Refusal describes one refused connection.
type Refusal struct {
	Time time.Time
	// Err wraps one of the Err* reasons above.
	Err error
	// What is known of the caller: the role it tried, and for an agent the
	// tenant and token id if the token could be read.
	Role    Role
	Tenant  string
	TokenID string
	Name    string
	// The connection: its host, client id and server.
	Host     string
	ClientID uint64
	ServerID string
}

// Auditor records refusals, for example as audit events on
// audit._system.bus.refused. It must not block for long: the server waits
// for the callout's answer.
type Auditor interface {
	Refused(ctx context.Context, r Refusal)
}

// Kicker closes one client connection on one server.
type Kicker interface {
	Kick(ctx context.Context, serverID string, clientID uint64) error
}

// CalloutConfig wires a Callout.
type CalloutConfig struct {
	Keys     *Keys
	Verifier TokenVerifier
	// Auditor receives refusals; nil drops them (they are still logged).
	Auditor Auditor
	// Kicker closes revoked connections; nil makes Revoke fail.
	Kicker Kicker
	// Tenants accepts a tenant; nil accepts every tenant. A callout serving
	// a server configured with accounts accepts the declared tenants only
	// (DeclaredTenants): any other has no account to be placed in.
	Tenants func(tenant string) bool
	// SiteUser refuses a site's credentials unless the site is declared
	// with their user (CheckSiteUser); nil refuses every site's: only a hub
	// that takes sites admits one.
	SiteUser func(site, user string) error
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	Log *slog.Logger
}

// Callout is the auth callout service. Lifecycle: NewCallout, then Start
// over a connection authenticated with Keys.CalloutConnectOption; the
// returned subscription lives until it is unsubscribed or the connection
// closes. Several callouts may serve one server (a queue group); each
// remembers only the connections it admitted, so Revoke must be called on
// every instance (they all watch the revocation bucket).
type Callout struct {
	cfg        CalloutConfig
	credSigner string
	issuer     nkeys.KeyPair // Keys.Issuer, expanded once for signing
	xkeys      *sharedKeys
	users      userClaimsCache

	mu   sync.Mutex
	live map[string][]liveConn // token id (and chain ids) -> admitted connections
}

type liveConn struct {
	serverID string
	clientID uint64
	expires  time.Time
}

// NewCallout checks cfg and returns a Callout.
func NewCallout(cfg CalloutConfig) (*Callout, error) {
	if cfg.Keys == nil {
		return nil, errors.New("busauth: callout needs keys")
	}
	if cfg.Verifier == nil {
		return nil, errors.New("busauth: callout needs a token verifier")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	xk, err := newSharedKeys(cfg.Keys.XKey)
	if err != nil {
		return nil, err
	}
	iss, err := newPresigner(cfg.Keys.Issuer)
	if err != nil {
		return nil, err
	}
	return &Callout{cfg: cfg, credSigner: mustPublic(cfg.Keys.CredSigner), issuer: iss, xkeys: xk, live: map[string][]liveConn{}}, nil
}

// calloutSubject is where nats-server sends authorization requests
// (server.AuthCalloutSubject); xkeyHeader names the server's curve key
// when requests are encrypted.
const (
	calloutSubject = "$SYS.REQ.USER.AUTH"
	xkeyHeader     = "Nats-Server-Xkey"
	calloutQueue   = "toolgate-auth"
)

// Start answers authorization requests on nc until the subscription ends.
func (c *Callout) Start(nc *nats.Conn) (*nats.Subscription, error) {
	return nc.QueueSubscribe(calloutSubject, calloutQueue, func(m *nats.Msg) {
		resp, err := c.Handle(m.Data, m.Header.Get(xkeyHeader))
		if err != nil {
			c.cfg.Log.Error("auth callout: unanswerable request", "err", err)
			return // the server times the CONNECT out and refuses it
		}
		if err := m.Respond(resp); err != nil {
			c.cfg.Log.Error("auth callout: answering", "err", err)
		}
	})
}

// Handle answers one authorization request (the raw message body and the
// server's xkey header, empty when unencrypted). It returns an error only
// when no answer can be built (undecodable request).
func (c *Callout) Handle(data []byte, serverXKey string) ([]byte, error) {
	if serverXKey != "" {
		var err error
		if data, err = c.xkeys.open(data, serverXKey); err != nil {
			return nil, fmt.Errorf("decrypting authorization request: %w", err)
		}
	}
	req, err := jwt.DecodeAuthorizationRequestClaims(string(data))
	if err != nil {
		return nil, fmt.Errorf("decoding authorization request: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	cr := jwt.NewAuthorizationResponseClaims(req.UserNkey)
	cr.Audience = req.Server.ID
	id, err := c.Authorize(ctx, req)
	if err == nil {
		cr.Jwt, err = c.userJWT(req.UserNkey, id)
	}
	if err != nil {
		c.refuse(ctx, req, id, err)
		cr.Error = "toolgate: " + err.Error()
	} else if id.Role == RoleAgent {
		c.track(id, req.Server.ID, req.ClientInformation.ID)
	}
	out, err := cr.Encode(c.issuer)
	if err != nil {
		return nil, err
	}
	if serverXKey != "" {
		return c.xkeys.seal([]byte(out), serverXKey)
	}
	return []byte(out), nil
}

// refuse logs and audits one refused connection.
func (c *Callout) refuse(ctx context.Context, req *jwt.AuthorizationRequestClaims, id Identity, err error) {
	r := refusal(req, id, err, c.cfg.Now())
	c.cfg.Log.Warn("bus connection refused", "reason", err, "role", r.Role, "tenant", r.Tenant,
		"jti", r.TokenID, "host", r.Host, "cid", r.ClientID)
	if c.cfg.Auditor != nil {
		c.cfg.Auditor.Refused(ctx, r)
	}
}

func refusal(req *jwt.AuthorizationRequestClaims, id Identity, err error, now time.Time) Refusal {
	return Refusal{
		Time: now, Err: err, Role: id.Role, Tenant: id.Tenant, TokenID: id.TokenID, Name: id.Name,
		Host: req.ClientInformation.Host, ClientID: req.ClientInformation.ID, ServerID: req.Server.ID,
	}
}

// Authorize decides who the connection described by req is. A user JWT
// (a .creds file) makes a worker or operator; a connect token makes an
// agent; anything else is refused. On refusal the returned Identity holds
// what could be learnt, for the audit record.
func (c *Callout) Authorize(ctx context.Context, req *jwt.AuthorizationRequestClaims) (Identity, error) {
	o := req.ConnectOptions
	switch {
	case o.JWT != "":
		// Only in operator mode: a server configured with accounts discards
		// the JWT of a CONNECT before the callout sees it.
		return c.authorizeCreds(req, o.JWT, "")
	case o.Nkey != "":
		// Toolgate credentials in config mode: the nkey and its nonce
		// signature prove the seed, the token field carries the user JWT.
		return c.authorizeCreds(req, o.Token, o.Nkey)
	case o.Token != "":
		return c.authorizeAgent(ctx, o.Token)
	case o.Username != "" || o.Password != "" || o.Nkey != "":
		return Identity{}, fmt.Errorf("%w: only a capability token (--token) or toolgate credentials (--creds) are accepted", ErrNoCredentials)
	case o.SignedNonce != "":
		// A nonce signed without the nkey that signed it: a user JWT the
		// server dropped, as `nats --creds` sends one.
		return Identity{}, fmt.Errorf("%w: a user JWT (nats --creds) is dropped by a server configured with accounts; "+
			"give the nkey and the JWT as the token (nats --nkey NAME.nk --token \"$(cat NAME.jwt)\"), or a context holding them (toolgate creds context NAME --creds FILE; nats --context NAME)", ErrNoCredentials)
	}
	return Identity{}, fmt.Errorf("%w: connect with a capability token (--token) or toolgate credentials (--creds)", ErrNoCredentials)
}

func (c *Callout) authorizeAgent(ctx context.Context, raw string) (Identity, error) {
	id := Identity{Role: RoleAgent}
	tok, err := c.cfg.Verifier.VerifyConnectToken(ctx, raw)
	if err != nil {
		return id, err
	}
	id.Name, id.Tenant, id.TokenID, id.Chain, id.Expires = tok.Subject, tok.Tenant, tok.ID, tok.Chain, tok.Expires
	id.TenantReader = tok.TenantReader
	if c.cfg.Tenants != nil && !c.cfg.Tenants(tok.Tenant) {
		return id, fmt.Errorf("%w: tenant %q has no account on this server (declare it in %s/%s and reload the server's %s)",
			ErrWrongTenant, tok.Tenant, DirName, TenantsFile, AuthConfFile)
	}
	if !id.Expires.IsZero() && !id.Expires.After(c.cfg.Now()) {
		return id, fmt.Errorf("%w: token expired at %s", ErrExpired, id.Expires.UTC().Format(time.RFC3339))
	}
	if err := subjects.CheckTenant(id.Tenant); err != nil {
		return id, fmt.Errorf("%w: %v", ErrBadToken, err)
	}
	if id.TokenID == "" {
		return id, fmt.Errorf("%w: token has no jti", ErrBadToken)
	}
	return id, nil
}

// authorizeCreds checks toolgate-issued credentials: the user JWT ujwt and
// the nkey that signed the server's nonce (nkey "" means the JWT's subject).
func (c *Callout) authorizeCreds(req *jwt.AuthorizationRequestClaims, ujwt, nkey string) (Identity, error) {
	o := req.ConnectOptions
	if ujwt == "" {
		return Identity{}, fmt.Errorf("%w: an nkey without toolgate credentials (the user JWT goes in the token)", ErrNoCredentials)
	}
	// DecodeUserClaims verifies the signature with the key the JWT names
	// as its issuer; we then require that issuer to be ours.
	uc, err := c.users.decode(ujwt)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: user JWT: %v", ErrBadSignature, err)
	}
	id := Identity{Name: uc.Name}
	if nkey != "" && nkey != uc.Subject {
		return id, fmt.Errorf("%w: the nkey is not the credentials' user", ErrBadNonce)
	}
	if uc.Issuer != c.credSigner || uc.IssuerAccount != "" {
		return id, fmt.Errorf("%w: user JWT issued by %s", ErrUnknownIssuer, uc.Issuer)
	}
	id.Role = roleOf(uc)
	if !id.Role.Issued() {
		return id, fmt.Errorf("%w: user JWT names no toolgate role", ErrBadToken)
	}
	now := c.cfg.Now()
	if uc.Expires > 0 {
		id.Expires = time.Unix(uc.Expires, 0)
		if !id.Expires.After(now) {
			return id, fmt.Errorf("%w: credentials expired at %s", ErrExpired, id.Expires.UTC().Format(time.RFC3339))
		}
	}
	if uc.NotBefore > 0 && now.Before(time.Unix(uc.NotBefore, 0)) {
		return id, fmt.Errorf("%w: credentials not valid before %s", ErrBadToken, time.Unix(uc.NotBefore, 0).UTC())
	}
	// The holder proves it has the seed: it signed the server's nonce.
	if err := verifyNonce(uc.Subject, []byte(req.ClientInformation.Nonce), o.SignedNonce); err != nil {
		return id, err
	}
	if id.Role == RoleSite {
		// A removed site's credentials, or those of a site declared again
		// since, are refused: the hub's record decides, not the JWT.
		if c.cfg.SiteUser == nil {
			return id, fmt.Errorf("%w: this server takes no sites", ErrUnknownSite)
		}
		if err := c.cfg.SiteUser(id.Name, uc.Subject); err != nil {
			return id, err
		}
	}
	return id, nil
}

// userJWT is the user the server creates for an admitted connection: the
// connection's own nkey as subject, the role's account as audience
// (placement), the role's permissions, expiring with the credentials.
func (c *Callout) userJWT(userNkey string, id Identity) (string, error) {
	g, err := GrantFor(id)
	if err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(userNkey)
	uc.Audience = g.Account
	uc.Name = id.UserName()
	uc.Permissions = g.Permissions
	if !id.Expires.IsZero() {
		uc.Expires = id.Expires.Unix()
	}
	return uc.Encode(c.issuer)
}

// track remembers an admitted agent connection under its token id and the
// ids of its chain, so revoking any of them closes it.
func (c *Callout) track(id Identity, serverID string, clientID uint64) {
	lc := liveConn{serverID: serverID, clientID: clientID, expires: id.Expires}
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range append([]string{id.TokenID}, id.Chain...) {
		conns := c.live[k][:0]
		for _, x := range c.live[k] {
			if x.expires.IsZero() || x.expires.After(now) {
				conns = append(conns, x)
			}
		}
		c.live[k] = append(conns, lc)
	}
}

// Revoke closes every connection this callout admitted with token jti or
// a token derived from it, and returns how many it closed. A connection
// that already ended counts as closed. Call it from the revocation
// bucket's watcher; the server then refuses the token at its next connect
// because the verifier sees the revocation.
func (c *Callout) Revoke(ctx context.Context, jti string) (int, error) {
	if c.cfg.Kicker == nil {
		return 0, errors.New("busauth: no kicker configured")
	}
	c.mu.Lock()
	conns := c.live[jti]
	delete(c.live, jti)
	c.mu.Unlock()
	var errs []error
	n := 0
	for _, lc := range conns {
		if err := c.cfg.Kicker.Kick(ctx, lc.serverID, lc.clientID); err != nil && !errors.Is(err, errNoSuchClient) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

var errNoSuchClient = errors.New("no such client")

// SystemKicker kicks clients through the system account's per-server
// request $SYS.REQ.SERVER.<server id>.KICK {"cid": N} (nats-server ≥ 2.10).
// NC must be authenticated as a system-account user
// (Keys.SystemConnectOption).
type SystemKicker struct {
	NC *nats.Conn
	// Timeout bounds one request when ctx has no deadline; default 1s.
	Timeout time.Duration
}

// Kick implements Kicker.
func (k SystemKicker) Kick(ctx context.Context, serverID string, clientID uint64) error {
	if _, ok := ctx.Deadline(); !ok {
		t := k.Timeout
		if t == 0 {
			t = time.Second
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	body, _ := json.Marshal(map[string]uint64{"cid": clientID})
	m, err := k.NC.RequestWithContext(ctx, "$SYS.REQ.SERVER."+serverID+".KICK", body)
	if err != nil {
		return fmt.Errorf("kicking client %d on %s: %w", clientID, serverID, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return fmt.Errorf("kicking client %d: %w", clientID, err)
	}
	if resp.Error != nil {
		if strings.Contains(resp.Error.Description, "no such client") {
			return errNoSuchClient
		}
		return fmt.Errorf("kicking client %d on %s: %s", clientID, serverID, resp.Error.Description)
	}
	return nil
}
