package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/signedstate"

	"github.com/cloudevents/sdk-go/v2/event"
	gjwt "github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/control"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// StartSecureEmbedded starts the embedded NATS server with bus
// authentication: it makes sure DataDir/busauth holds the deployment's keys
// and credentials (busauth.WriteCredentials), and configures the server
// with no anonymous access. The returned Gate authenticates every client
// inside the server (busauth.InProcess), with the same mapping from
// credentials to rights as the auth callout of external servers but without
// its round trip; Attach it once the node is open. A JetStream store written
// by an earlier, unauthenticated toolgate (account $G) is moved to account
// TOOLGATE.
func StartSecureEmbedded(o EmbeddedOptions, log *slog.Logger) (*server.Server, *Gate, error) {
	if o.DataDir == "" {
		return nil, nil, errEmbeddedDataDir
	}
	if log == nil {
		log = slog.Default()
	}
	host, portStr, err := splitListen(o.Listen)
	if err != nil {
		return nil, nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen port %q: %w", portStr, err)
	}
	keys, err := busauth.WriteCredentials(o.DataDir)
	if err != nil {
		return nil, nil, fmt.Errorf("bus credentials: %w", err)
	}
	if err := migrateGlobalAccount(o.DataDir); err != nil {
		return nil, nil, err
	}
	g := &Gate{auditor: &refusalAuditor{log: log}}
	auth, err := busauth.NewInProcess(busauth.CalloutConfig{Keys: keys, Verifier: &g.verifier, Auditor: g.auditor, Log: log,
		SiteUser: func(site, user string) error { return busauth.CheckSiteUser(o.DataDir, site, user) }})
	if err != nil {
		return nil, nil, err
	}
	g.Callout, g.inProcess = auth.Callout(), auth
	opts, err := busauth.EmbeddedOptions(keys, busauth.ServerSettings{
		Name: "toolgate", Host: host, Port: port, StoreDir: o.DataDir, MaxPayload: o.MaxPayload, InProcess: auth,
	})
	if err != nil {
		return nil, nil, err
	}
	if o.LeafListen != "" {
		lh, lp, err := splitListen(o.LeafListen)
		if err != nil {
			return nil, nil, err
		}
		if opts.LeafNode.Port, err = strconv.Atoi(lp); err != nil {
			return nil, nil, fmt.Errorf("leaf listen port %q: %w", lp, err)
		}
		// Only a site's credentials admit a leaf node (busauth.InProcess).
		opts.LeafNode.Host = lh
		opts.JetStreamDomain = subjects.HubDomain
	}
	opts.NoLog = !o.Logging
	opts.SyncAlways = o.SyncAlways
	opts.SyncInterval = o.SyncInterval
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("configuring embedded NATS: %w", err)
	}
	auth.Bind(ns)
	if o.Logging {
		ns.ConfigureLogger()
	}
	// The server says only in its log what it refuses a site's link or an
	// admitted client: the log is read for the audit trail.
	ns.SetLoggerV2(&leafRefusals{inner: ns.Logger(), auditor: g.auditor, clients: newClientRefusals(ns, g.auditor)},
		opts.Debug, opts.Trace, false)
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, nil, fmt.Errorf("embedded NATS did not start listening on %s", o.Listen)
	}
	return ns, g, nil
}

// migrateGlobalAccount renames the store of the global account ($G), where
// toolgate's streams lived before the bus was authenticated, to account
// TOOLGATE's, unless that one exists already.
func migrateGlobalAccount(dataDir string) error {
	js := filepath.Join(dataDir, "jetstream")
	old, tg := filepath.Join(js, server.DEFAULT_GLOBAL_ACCOUNT), filepath.Join(js, busauth.AccountToolgate)
	if _, err := os.Stat(old); err != nil {
		return nil
	}
	if _, err := os.Stat(tg); err == nil {
		return nil
	}
	if err := os.Rename(old, tg); err != nil {
		return fmt.Errorf("moving the unauthenticated store to account %s: %w", busauth.AccountToolgate, err)
	}
	return nil
}

// CredsPath is where serve writes a role's credentials in dataDir.
func CredsPath(dataDir string, role busauth.Role) string {
	return filepath.Join(dataDir, busauth.DirName, busauth.CredsFile(role))
}

// Gate is the bus's authentication as run by toolgate, the auth callout
// (StartGate) or in-process (StartSecureEmbedded): it verifies agents'
// capability tokens exactly as authorize does, records refusals in the
// audit trail, and closes the connections of revoked tokens.
type Gate struct {
	Callout *busauth.Callout
	// inProcess is the embedded server's authentication, when the gate is
	// it (StartSecureEmbedded): it cuts a removed site's links.
	inProcess *busauth.InProcess
	verifier  connectVerifier
	auditor   *refusalAuditor
	conns     []*nats.Conn
}

// StartGate starts the callout on a server: through opts (the server's URL
// or nats.InProcessServer), authenticated as the deployment's callout and
// system users. Until Attach supplies the token verifier and the node, agent
// connections are refused (workers and operators are not). tenants are the
// tenants the server's configuration has accounts for (busauth.TenantsFile);
// agents of any other are refused.
func StartGate(url string, keys *busauth.Keys, tenants []string, log *slog.Logger, opts ...nats.Option) (*Gate, error) {
	g := &Gate{auditor: &refusalAuditor{log: log}}
	sys, err := nats.Connect(url, append([]nats.Option{nats.Name("toolgate-kicker"), keys.SystemConnectOption(), nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("system connection: %w", err)
	}
	g.conns = append(g.conns, sys)
	g.Callout, err = busauth.NewCallout(busauth.CalloutConfig{
		Keys: keys, Verifier: &g.verifier, Auditor: g.auditor, Kicker: busauth.SystemKicker{NC: sys}, Log: log,
		Tenants: busauth.DeclaredTenants(tenants),
	})
	if err != nil {
		g.Close()
		return nil, err
	}
	cc, err := nats.Connect(url, append([]nats.Option{nats.Name("toolgate-auth-callout"), keys.CalloutConnectOption(), nats.MaxReconnects(-1)}, opts...)...)
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("callout connection: %w", err)
	}
	g.conns = append(g.conns, cc)
	if _, err := g.Callout.Start(cc); err != nil {
		g.Close()
		return nil, err
	}
	return g, cc.Flush()
}

// Attach gives the gate the token verifier and the node whose revocation
// set and connection it uses; it watches the revocation bucket until ctx
// ends, closing a revoked token's live connections.
func (g *Gate) Attach(ctx context.Context, v *token.Verifier, n *Node) error {
	g.verifier.v.Store(v)
	g.verifier.rev.Store(n.Revoked)
	g.auditor.node.Store(n)
	return n.Store.WatchRevocations(ctx, func(jti string, on bool) {
		// The set the verifier reads is kept by a watch of its own; mark
		// the token here first, so a client kicked now cannot connect
		// again before that watch has caught up.
		n.Revoked.Set(jti, on)
		if !on {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if k, err := g.Callout.Revoke(rctx, jti); err != nil {
			n.Log.Error("closing a revoked token's connections", "jti", jti, "err", err)
		} else if k > 0 {
			n.Log.Info("revoked token's connections closed", "jti", jti, "connections", k)
		}
	}, nil) // the control node's own watch audits an ignored removal
}

// Close closes the gate's connections.
func (g *Gate) Close() {
	for _, nc := range g.conns {
		nc.Close()
	}
}

// connectVerifier adapts internal/token to busauth.TokenVerifier.
type connectVerifier struct {
	v   atomic.Pointer[token.Verifier]
	rev atomic.Pointer[token.Revocations]
}

func (a *connectVerifier) VerifyConnectToken(_ context.Context, raw string) (busauth.AgentToken, error) {
	v, rev := a.v.Load(), a.rev.Load()
	if v == nil || rev == nil {
		return busauth.AgentToken{}, fmt.Errorf("%w: toolgate is not ready to verify tokens", busauth.ErrBadToken)
	}
	c, err := v.Verify(raw)
	if err != nil {
		switch {
		case errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.ETokenExpired}):
			return busauth.AgentToken{}, errors.Join(busauth.ErrExpired, err)
		case errors.Is(err, gjwt.ErrTokenSignatureInvalid), errors.Is(err, gjwt.ErrTokenUnverifiable):
			return busauth.AgentToken{}, errors.Join(busauth.ErrBadSignature, err)
		}
		return busauth.AgentToken{}, errors.Join(busauth.ErrBadToken, err)
	}
	at := busauth.AgentToken{Tenant: c.TenantID, Subject: c.AgentDID, ID: c.ID, Chain: c.Chain, TenantReader: c.TenantReader}
	if c.ExpiresAt != nil {
		at.Expires = c.ExpiresAt.Time
	}
	if id, revoked := rev.Revoked(c); revoked {
		return at, fmt.Errorf("%w: token %s is revoked", busauth.ErrRevoked, id)
	}
	return at, nil
}

// refusalAuditor publishes each refused connection as an audit event.
type refusalAuditor struct {
	node atomic.Pointer[Node]
	log  *slog.Logger
	seq  atomic.Uint64

	mu sync.Mutex
	// undeclared is when each site's leaf link was last audited refused
	// as undeclared: a removed site's process redials every second, and
	// its refusals are audited at most once a minute.
	undeclared map[string]time.Time
}

// quiet reports whether r repeats, within a minute, the audited refusal
// of a link of a site the hub does not declare.
func (a *refusalAuditor) quiet(r busauth.Refusal) bool {
	if r.Role != busauth.RoleSite || !errors.Is(r.Err, busauth.ErrUnknownSite) {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if last, ok := a.undeclared[r.Name]; ok && r.Time.Sub(last) < time.Minute {
		return true
	}
	if a.undeclared == nil {
		a.undeclared = map[string]time.Time{}
	}
	a.undeclared[r.Name] = r.Time
	return false
}

// RefusalRecord is the data of a bus.refused audit event.
type RefusalRecord struct {
	Reason   string `json:"reason"`
	Role     string `json:"role,omitempty"`
	Tenant   string `json:"tenant,omitempty"`
	TokenID  string `json:"token_id,omitempty"`
	Name     string `json:"name,omitempty"`
	Host     string `json:"host,omitempty"`
	ClientID uint64 `json:"client_id,omitempty"`
	ServerID string `json:"server_id,omitempty"`
}

func (a *refusalAuditor) Refused(_ context.Context, r busauth.Refusal) {
	n := a.node.Load()
	if n == nil {
		return // before the node connects: only workers' own retries, logged by the callout
	}
	if a.quiet(r) {
		return // logged by the callout
	}
	e := event.New()
	e.SetID(fmt.Sprintf("%s-%d-%d", r.ServerID, r.ClientID, a.seq.Add(1)))
	e.SetSource("urn:toolgate:busauth")
	e.SetType(api.TypeBusRefused)
	e.SetTime(r.Time.UTC())
	_ = e.SetData(event.ApplicationJSON, RefusalRecord{
		Reason: r.Err.Error(), Role: string(r.Role), Tenant: r.Tenant, TokenID: r.TokenID, Name: r.Name,
		Host: r.Host, ClientID: r.ClientID, ServerID: r.ServerID,
	})
	o, err := stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeBusRefused)), &e)
	if err != nil {
		return
	}
	// The callout must answer the server quickly: publish without waiting
	// for the stream's acknowledgement. The node's JetStream signs it, and
	// sends it through audit, which alone publishes audit events.
	if _, err := runner.PublishAsync(n.JS, o); err != nil {
		a.log.Error("auditing a refused connection", "err", err)
	}
}

// decidersFrom verifies approval decisions and administrative requests: signed with a
// person's or the operator's credentials issued by the same signer as this process's own
// (credsPath). The decider recorded is the credentials' user name, "approver:<name>",
// "admin:<name>" ("operator:<name>" for break-glass).
func decidersFrom(credsPath string) (control.Identify, error) {
	signer, err := busauth.CredSignerOf(credsPath)
	if err != nil {
		return nil, fmt.Errorf("approval deciders: %w", err)
	}
	v := busauth.RequestVerifier{CredSigner: signer}
	return func(subject string, h nats.Header, body []byte) (string, error) {
		id, err := v.Verify(subject, h, body)
		if err != nil {
			return "", err
		}
		// People sign; which role may sign which request the control
		// service checks per endpoint (busauth.MaySign). Workers' and
		// control's credentials sign nothing a person does.
		if id.Role != busauth.RoleOperator && !id.Role.Person() {
			return "", fmt.Errorf("%w: %s credentials may not decide approvals or make administrative changes", busauth.ErrUnsigned, id.Role)
		}
		return id.UserName(), nil
	}, nil
}

// StateProofs is stateProofs for readers outside the node (the MCP front
// end with service credentials).
func StateProofs(credsPath string) (signedstate.Verify, error) { return stateProofs(credsPath) }

// stateProofs verifies, for the readers of signed state
// (internal/signedstate), a stored signed request as of the time it was
// signed: by credentials of the deployment whose credential signer issued
// credsPath, of a role that may send the stored request (an admin's, or the
// operator's).
func stateProofs(credsPath string) (signedstate.Verify, error) {
	signer, err := busauth.CredSignerOf(credsPath)
	if err != nil {
		return nil, fmt.Errorf("signed state: %w", err)
	}
	return func(p *api.DecisionProof) (string, error) {
		h := nats.Header(p.Headers)
		ms, err := strconv.ParseInt(h.Get(busauth.HeaderSignedAt), 10, 64)
		if err != nil {
			return "", fmt.Errorf("%w: bad %s", busauth.ErrUnsigned, busauth.HeaderSignedAt)
		}
		v := busauth.RequestVerifier{CredSigner: signer, Now: func() time.Time { return time.UnixMilli(ms) }}
		id, err := v.Verify(p.Subject, h, p.Body)
		if err != nil {
			return "", err
		}
		// The stored request is an administrative one: an admin's, or the
		// operator's (break-glass).
		if !busauth.MaySign(id.Role, p.Subject) {
			return "", fmt.Errorf("signed by %s, whose role may not send %s", id.UserName(), p.Subject)
		}
		return id.UserName(), nil
	}, nil
}

// approvalProofs verifies, for authorize, that an approved call's approval
// record holds the signed decision the control service accepted: signed,
// within two minutes of the recorded decision, by an approver's (or the
// operator's) credentials of the deployment whose credential signer issued
// credsPath, by the person recorded as the decider, approving exactly this
// invocation.
func approvalProofs(credsPath string) (func(kvstore.Approval, string) error, error) {
	signer, err := busauth.CredSignerOf(credsPath)
	if err != nil {
		return nil, fmt.Errorf("approval proofs: %w", err)
	}
	return func(a kvstore.Approval, request string) error {
		p := a.Proof
		if p == nil {
			return errors.New("the record holds no signed decision")
		}
		if p.Subject != subjects.SvcApproval {
			return fmt.Errorf("the signed request went to %q", p.Subject)
		}
		v := busauth.RequestVerifier{CredSigner: signer, Now: func() time.Time { return a.DecidedAt }}
		id, err := v.Verify(p.Subject, nats.Header(p.Headers), p.Body)
		if err != nil {
			return err
		}
		if !busauth.MaySign(id.Role, subjects.SvcApproval) || id.UserName() != a.DecidedBy {
			return fmt.Errorf("signed by %s, recorded as decided by %s", id.UserName(), a.DecidedBy)
		}
		var d api.ApprovalDecision
		if err := json.Unmarshal(p.Body, &d); err != nil || d.Tenant != a.Tenant || d.InvocationID != a.InvocationID || !d.Approve {
			return fmt.Errorf("the signed decision is not an approval of invocation %s of tenant %s", a.InvocationID, a.Tenant)
		}
		if d.RequestDigest == "" || d.RequestDigest != request {
			return fmt.Errorf("the signed approval is of request %q, the call asks %q: its request changed after it was approved", d.RequestDigest, request)
		}
		return nil
	}, nil
}
