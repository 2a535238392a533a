package busauth

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/subjects"
)

// PublicKeys are the public halves of Keys: all a server's configuration
// needs.
type PublicKeys struct {
	Issuer      string // A…: auth_callout issuer
	CalloutUser string // U…: the callout service's nkey user
	SystemUser  string // U…: the system account's nkey user
	XKey        string // X…: auth_callout xkey
}

// Public returns the public keys.
func (k *Keys) Public() PublicKeys {
	return PublicKeys{
		Issuer:      mustPublic(k.Issuer),
		CalloutUser: mustPublic(k.CalloutUser),
		SystemUser:  mustPublic(k.SystemUser),
		XKey:        mustPublic(k.XKey),
	}
}

// toolgateServiceExports are the subjects account TOOLGATE exports as
// services to the tenants' accounts; each tenant account imports its own
// tenant's part of them (tenantServices).
func toolgateServiceExports() []string {
	out := []string{subjects.InvokeAll}
	for _, svc := range agentServices {
		out = append(out, subjects.TenantSvc("*", svc))
	}
	return append(out, "$JS.API.DIRECT.GET."+subjects.StreamResults+".>")
}

// toolgateStreamExports are the subjects TOOLGATE exports as streams
// (tenantStreams).
func toolgateStreamExports() []string {
	return []string{subjects.ResultAll, subjects.AuditAll}
}

// ServerConfig renders the accounts, system account and authorization
// blocks of nats-server's configuration: the file an external server
// includes (deploy/*/nats.conf: `include auth.conf`) and the text the
// embedded server parses. There is no user but the callout's and the
// system account's; every other connection goes through the callout.
// tenants are the declared tenants (TenantsFile): each gets its account.
func ServerConfig(pk PublicKeys, tenants []string) string {
	var b strings.Builder
	b.WriteString(accountsConfig(pk, tenants))
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("authorization {")
	p("  auth_callout {")
	p("    issuer: %s", pk.Issuer)
	p("    account: %s", AccountAuth)
	p("    auth_users: [ %s, %s ]", pk.CalloutUser, pk.SystemUser)
	if pk.XKey != "" {
		p("    xkey: %s", pk.XKey)
	}
	p("  }")
	p("}")
	return b.String()
}

// accountsConfig renders the accounts and the system account.
func accountsConfig(pk PublicKeys, tenants []string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p("# toolgate bus authentication, generated; see docs/security.md.")
	p("accounts {")
	p("  %s: { users: [ { nkey: %s } ] }", AccountAuth, pk.CalloutUser)
	p("  %s: { users: [ { nkey: %s } ] }", AccountSystem, pk.SystemUser)
	p("  %s: {", AccountToolgate)
	p("    jetstream: enabled")
	p("    exports: [")
	for _, s := range toolgateServiceExports() {
		p("      { service: %q }", s)
	}
	for _, s := range toolgateStreamExports() {
		p("      { stream: %q }", s)
	}
	p("    ]")
	p("  }")
	for _, t := range tenants {
		p("  %s: {", TenantAccount(t))
		p("    imports: [")
		for _, s := range tenantServices(t) {
			p("      { service: { account: %s, subject: %q }, share: true }", AccountToolgate, s)
		}
		for _, s := range tenantStreams(t) {
			p("      { stream: { account: %s, subject: %q } }", AccountToolgate, s)
		}
		p("    ]")
		p("  }")
	}
	p("}")
	p("system_account: %s", AccountSystem)
	return b.String()
}

// ServerSettings are the embedded server's own settings.
type ServerSettings struct {
	Name     string
	Host     string // default 127.0.0.1
	Port     int    // -1 picks a free port
	StoreDir string // JetStream store directory
	// MaxPayload defaults to 8 MiB, like deploy/single/nats.conf.
	MaxPayload int32
	// AuthTimeout bounds a CONNECT including the callout's answer; default 2s.
	AuthTimeout time.Duration
	// InProcess, when set, authenticates clients inside the server instead
	// of through the auth callout; Bind it to the server before Start.
	InProcess *InProcess
	// Tenants are the declared tenants whose accounts the configuration
	// holds. Through the callout an agent of another tenant has no account
	// to go to; in-process, a tenant's account is created when its first
	// agent connects.
	Tenants []string
}

// EmbeddedOptions returns the options of an embedded server with JetStream
// and no anonymous access: the same accounts as ServerConfig, with either
// st.InProcess authenticating clients (Bind it to the server before Start)
// or the auth callout (start the callout, Callout.Start over a connection
// made with CalloutConnectOption, before any other client connects).
func EmbeddedOptions(k *Keys, st ServerSettings) (*server.Options, error) {
	o := &server.Options{}
	// The callout of an embedded server answers in-process: no other
	// connection can see its requests, so they go unencrypted.
	pk := k.Public()
	pk.XKey = ""
	conf := ServerConfig(pk, st.Tenants)
	if st.InProcess != nil {
		conf = accountsConfig(pk, st.Tenants)
	}
	if err := o.ProcessConfigString(conf); err != nil {
		return nil, fmt.Errorf("bus auth configuration: %w", err)
	}
	if st.InProcess != nil {
		o.CustomClientAuthentication = st.InProcess
		o.AlwaysEnableNonce = true // credentials prove their seed by signing it
	}
	o.ServerName = st.Name
	o.Host = st.Host
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	o.Port = st.Port
	o.JetStream = true
	o.StoreDir = st.StoreDir
	o.MaxPayload = st.MaxPayload
	if o.MaxPayload == 0 {
		o.MaxPayload = 8 << 20
	}
	o.AuthTimeout = st.AuthTimeout.Seconds()
	if o.AuthTimeout == 0 {
		o.AuthTimeout = 2
	}
	o.NoSigs = true
	return o, nil
}

// CalloutConnectOption authenticates the callout service's connection.
func (k *Keys) CalloutConnectOption() nats.Option {
	return nats.Nkey(mustPublic(k.CalloutUser), k.CalloutUser.Sign)
}

// SystemConnectOption authenticates a system-account connection (for
// kicking revoked clients).
func (k *Keys) SystemConnectOption() nats.Option {
	return nats.Nkey(mustPublic(k.SystemUser), k.SystemUser.Sign)
}
