// Package connect is how toolgate's command line (and anything else that
// talks to a running toolgate from outside) reaches NATS: one set of
// connection flags and environment variables, the credentials they name
// turned into nats.go options, and the tenant a command acts for.
//
// Identity, in order: a .creds file (--creds): a toolgate-issued one, for
// workers and operators, sent as nkey plus JWT-as-token
// (busauth.CredentialsOption), any other through nats.UserCredentials; an
// nkey seed and connect token as the nats CLI takes them (--nkey,
// $NATS_NKEY, $NATS_TOKEN); an agent's capability token (--token) sent as
// the connect token with the inbox prefix only that token may use
// (busauth.InboxPrefix); a `nats` CLI context (--context); else LocalCreds
// when set.
package connect

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"github.com/synadia-io/orbit.go/natscontext"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
)

// Environment variables read when the matching flag is not given.
const (
	EnvURL     = "NATS_URL"
	EnvCreds   = "NATS_CREDS"
	EnvContext = "NATS_CONTEXT"
	EnvToken   = "TOOLGATE_TOKEN"
	EnvTenant  = "TOOLGATE_TENANT"
	// EnvNkey and EnvNATSToken are the nats CLI's: an nkey seed file and a
	// connect token (for toolgate's operator: its credentials' JWT).
	EnvNkey      = "NATS_NKEY"
	EnvNATSToken = "NATS_TOKEN"
)

// ErrNoTenant is returned by Tenant when neither --tenant nor a token names one.
var ErrNoTenant = errors.New("no tenant: give --tenant (or TOOLGATE_TENANT), or a capability token (--token, TOOLGATE_TOKEN) whose tenant_id claim names it")

// Error is a failure to reach the server, as opposed to a failed request.
type Error struct{ Err error }

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Options are the connection settings. The zero value connects anonymously
// to $NATS_URL, else nats://127.0.0.1:4222.
type Options struct {
	URL         string
	Creds       string
	Token       string
	Context     string
	TLSCert     string
	TLSKey      string
	TLSCA       string
	InboxPrefix string
	Tenant      string
	// Nkey is an nkey seed file; NATSToken a connect token. With both, the
	// pair is what CredentialsOption sends for a toolgate .creds file.
	Nkey      string
	NATSToken string
	// LocalCreds is used when nothing else names an identity: the CLI sets
	// it to a local serve's operator credentials when they exist.
	LocalCreds string
	// Name is the connection name servers show (default toolgate-cli).
	Name string

	agentContext bool
	// flags are the identity settings given as flags (Resolve): a flag
	// wins over the environment, whatever the order below.
	flags map[string]bool
}

// Identity names the credential a connection presents and where it came
// from, for the user to tell what the bus refused.
type Identity struct {
	// Kind is creds, nkey, token, context or none.
	Kind string
	// What and From say it for people: "the credentials file x.creds",
	// "--creds".
	What, From string
}

func (i Identity) String() string {
	if i.Kind == "none" {
		return "no credentials"
	}
	return i.What + " (from " + i.From + ")"
}

// AddFlags registers the connection flags on fs. Defaults stay empty so
// help output does not depend on the environment; Resolve reads the
// environment for flags not given.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.URL, "nats", "", "NATS server URL (env "+EnvURL+"; default "+nats.DefaultURL+")")
	fs.StringVar(&o.Creds, "creds", "", "NATS credentials file: toolgate-issued .creds of a role (a stage, control, operator) or any user .creds (env "+EnvCreds+")")
	fs.StringVar(&o.Nkey, "nkey", "", "nkey seed file to authenticate with, as the nats CLI (env "+EnvNkey+"; with env "+EnvNATSToken+" as the connect token)")
	fs.StringVar(&o.Token, "token", "", "an agent's capability token, for invocations and to connect as that agent (env "+EnvToken+")")
	fs.StringVar(&o.Context, "context", "", "a nats CLI context to take the server and credentials from (env "+EnvContext+")")
	fs.StringVar(&o.TLSCert, "tlscert", "", "client TLS certificate file")
	fs.StringVar(&o.TLSKey, "tlskey", "", "client TLS private key file")
	fs.StringVar(&o.TLSCA, "tlsca", "", "CA certificate file to verify the server with")
	fs.StringVar(&o.InboxPrefix, "inbox-prefix", "", "reply subject prefix (default: _INBOX, or an agent token's own _INBOX.<tenant>.<token id>)")
	fs.StringVar(&o.Tenant, "tenant", "", "tenant to act for (env "+EnvTenant+"; default: the token's tenant_id)")
}

// Resolve fills the settings not given as flags from the environment.
func (o *Options) Resolve() {
	o.flags = map[string]bool{"creds": o.Creds != "", "nkey": o.Nkey != "", "token": o.Token != "", "context": o.Context != ""}
	o.URL = cmp.Or(o.URL, os.Getenv(EnvURL))
	o.Creds = cmp.Or(o.Creds, os.Getenv(EnvCreds))
	o.Token = strings.TrimSpace(cmp.Or(o.Token, os.Getenv(EnvToken)))
	o.Context = cmp.Or(o.Context, os.Getenv(EnvContext))
	o.Tenant = cmp.Or(o.Tenant, os.Getenv(EnvTenant))
	o.Nkey = cmp.Or(o.Nkey, os.Getenv(EnvNkey))
	o.NATSToken = cmp.Or(o.NATSToken, strings.TrimSpace(os.Getenv(EnvNATSToken)))
	// A context holding an agent's capability token (toolgate creds
	// context --token) acts as that agent, as --token would.
	// An explicit --context wins over a token from the environment.
	if o.Context != "" && (o.Token == "" || o.flags["context"] && !o.flags["token"]) {
		if c, err := LoadContext(o.Context); err == nil && c.Token != "" && c.NKey == "" && c.Creds == "" && !IsToolgateCreds([]byte(c.Token)) {
			o.Token, o.agentContext = c.Token, true
		}
	}
}

// AgentContext reports whether the context names an agent's capability
// token (Resolve took it as Token).
func (o *Options) AgentContext() bool { return o.agentContext }

// Identity is the credential Connect presents: an explicit flag (--creds,
// --nkey, --context, --token) before anything from the environment
// (NATS_CREDS, NATS_NKEY and NATS_TOKEN, TOOLGATE_TOKEN, NATS_CONTEXT), then
// LocalCreds.
func (o *Options) Identity() Identity {
	from := func(name, flag, env string) string {
		if o.flags[name] {
			return flag
		}
		return "$" + env
	}
	creds := func(path, src string) Identity {
		return Identity{Kind: "creds", What: "the credentials file " + path, From: src}
	}
	for _, explicit := range []bool{true, false} {
		switch {
		case o.Creds != "" && o.flags["creds"] == explicit:
			return creds(o.Creds, from("creds", "--creds", EnvCreds))
		case (o.Nkey != "" && o.flags["nkey"] == explicit) || (!explicit && o.NATSToken != ""):
			var parts []string
			if o.Nkey != "" {
				parts = append(parts, "the nkey "+o.Nkey+" ("+from("nkey", "--nkey", EnvNkey)+")")
			}
			if o.NATSToken != "" {
				parts = append(parts, "the connect token of $"+EnvNATSToken)
			}
			src := from("nkey", "--nkey", EnvNkey)
			if o.Nkey == "" {
				src = "$" + EnvNATSToken
			}
			return Identity{Kind: "nkey", What: strings.Join(parts, " with "), From: src}
		case o.Context != "" && o.agentContext && o.flags["context"] == explicit:
			return Identity{Kind: "token", What: "the capability token of nats context " + o.Context, From: from("context", "--context", EnvContext)}
		case o.Context != "" && !o.agentContext && explicit && o.flags["context"]:
			return Identity{Kind: "context", What: "the credentials of nats context " + o.Context, From: "--context"}
		case o.Token != "" && !o.agentContext && o.flags["token"] == explicit:
			return Identity{Kind: "token", What: "the capability token", From: from("token", "--token", EnvToken)}
		case !explicit && o.Context != "" && !o.agentContext:
			return Identity{Kind: "context", What: "the credentials of nats context " + o.Context, From: "$" + EnvContext}
		}
	}
	if o.LocalCreds != "" {
		return creds(o.LocalCreds, "--data")
	}
	return Identity{Kind: "none"}
}

// ServerURL is the server Connect dials without a context.
func (o *Options) ServerURL() string { return cmp.Or(o.URL, nats.DefaultURL) }

// TenantFor is --tenant, else the tenant_id of the token (--token, else
// fallback, such as a development token), else ErrNoTenant.
func (o *Options) TenantFor(fallback string) (string, error) {
	if o.Tenant != "" {
		return o.Tenant, nil
	}
	if tok := cmp.Or(o.Token, fallback); tok != "" {
		c, err := api.ReadTokenClaims(tok)
		if err != nil {
			return "", err
		}
		if c.TenantID != "" {
			return c.TenantID, nil
		}
	}
	return "", ErrNoTenant
}

// IsToolgateCreds reports whether a .creds file was issued by toolgate
// (busauth.IssuedCredentials).
func IsToolgateCreds(b []byte) bool { return busauth.IssuedCredentials(b) }

// NATSOptions turns the settings into nats.go options (without the server
// URL or context, which Connect handles).
func (o *Options) NATSOptions() ([]nats.Option, error) {
	opts := []nats.Option{nats.Name(cmp.Or(o.Name, "toolgate-cli"))}
	id := o.Identity()
	switch id.Kind {
	case "creds":
		creds := cmp.Or(o.Creds, o.LocalCreds)
		if id.From == "--data" {
			creds = o.LocalCreds
		}
		b, err := os.ReadFile(creds)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id.From, err)
		}
		if IsToolgateCreds(b) {
			opts = append(opts, busauth.CredentialsOption(creds))
		} else {
			opts = append(opts, nats.UserCredentials(creds))
		}
	case "nkey":
		if o.Nkey != "" {
			nk, err := nats.NkeyOptionFromSeed(o.Nkey)
			if err != nil {
				return nil, fmt.Errorf("--nkey: %w", err)
			}
			opts = append(opts, nk)
		}
		if o.NATSToken != "" {
			opts = append(opts, nats.Token(o.NATSToken))
		}
	case "token":
		opts = append(opts, nats.Token(o.Token))
		if o.InboxPrefix == "" {
			// A token that does not decode is still sent: the server
			// says what is wrong with it.
			if c, err := api.ReadTokenClaims(o.Token); err == nil && c.TenantID != "" && c.ID != "" {
				opts = append(opts, nats.CustomInboxPrefix(busauth.InboxPrefix(c.TenantID, c.ID)))
			}
		}
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.TLSCert != "" || o.TLSKey != "" {
		if o.TLSCert == "" || o.TLSKey == "" {
			return nil, errors.New("--tlscert and --tlskey go together")
		}
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("--tlsca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tlsca %s: no certificates", o.TLSCA)
		}
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	return opts, nil
}

// Connect dials the server. Failures to reach it are *Error.
func (o *Options) Connect() (*nats.Conn, error) {
	opts, err := o.NATSOptions()
	if err != nil {
		return nil, err
	}
	if o.Context != "" {
		if o.URL != "" { // --nats overrides the context's server
			opts = append(opts, func(no *nats.Options) error {
				no.Url, no.Servers = "", strings.Split(o.URL, ",")
				return nil
			})
		}
		nc, _, err := natscontext.Connect(o.Context, opts...)
		if err != nil {
			return nil, &Error{fmt.Errorf("connecting with context %s: %w", o.Context, err)}
		}
		return nc, nil
	}
	nc, err := nats.Connect(o.ServerURL(), opts...)
	if err != nil {
		return nil, &Error{fmt.Errorf("connecting to %s: %w", o.ServerURL(), err)}
	}
	return nc, nil
}

// Signer signs requests with the operator credentials these settings
// connect with, so toolgate can tell which operator sent a request (approval
// decisions); nil when they name none.
func (o *Options) Signer() (*busauth.Signer, error) {
	id := o.Identity()
	switch {
	case id.Kind == "creds":
		creds := o.Creds
		if id.From == "--data" {
			creds = o.LocalCreds
		}
		b, err := os.ReadFile(creds)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id.From, err)
		}
		if !IsToolgateCreds(b) {
			return nil, nil
		}
		return busauth.SignerFromCreds(creds)
	case id.Kind == "nkey" && o.Nkey != "" && o.NATSToken != "":
		return busauth.SignerFromParts(o.Nkey, o.NATSToken)
	case id.Kind == "context":
		// A context holding operator credentials signs as they would
		// given directly: as an nkey with its JWT as the token (what
		// WriteContext writes), or as a toolgate .creds file.
		c, err := LoadContext(o.Context)
		if err != nil {
			return nil, err
		}
		switch {
		case c.Creds != "":
			return (&Options{Creds: expandHome(c.Creds)}).Signer()
		case c.NKey != "" && c.Token != "" && IsToolgateCreds([]byte(c.Token)):
			return busauth.SignerFromParts(expandHome(c.NKey), c.Token)
		}
	}
	return nil, nil
}

// Context is what toolgate reads and writes of a nats CLI context: the
// fields of the nats CLI's context file it uses.
type Context struct {
	Description string `json:"description"`
	URL         string `json:"url"`
	Token       string `json:"token"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	InboxPrefix string `json:"inbox_prefix"`
}

// ContextPath is where the nats CLI keeps context name: name itself when it
// is an absolute path, else $XDG_CONFIG_HOME/nats/context/<name>.json
// (default ~/.config).
func ContextPath(name string) (string, error) {
	if filepath.IsAbs(name) {
		return name, nil
	}
	if name == "" || strings.Contains(name, "..") || strings.ContainsRune(name, os.PathSeparator) {
		return "", fmt.Errorf("%q is not a context name", name)
	}
	parent := os.Getenv("XDG_CONFIG_HOME")
	if parent == "" {
		u, err := user.Current()
		if err != nil || u.HomeDir == "" {
			return "", errors.New("cannot determine the home directory for the nats contexts")
		}
		parent = filepath.Join(u.HomeDir, ".config")
	}
	return filepath.Join(parent, "nats", "context", name+".json"), nil
}

// LoadContext reads the nats CLI context name.
func LoadContext(name string) (Context, error) {
	var c Context
	path, err := ContextPath(name)
	if err != nil {
		return c, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("nats context %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("nats context %s: %w", name, err)
	}
	return c, nil
}

// WriteContext writes context name as the nats CLI reads it, readable by
// its owner only: it holds credentials.
func WriteContext(name string, c Context) (string, error) {
	path, err := ContextPath(name)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, append(b, '\n'), 0o600)
}

// expandHome expands a leading ~/ as the nats CLI does in context paths.
func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if u, err := user.Current(); err == nil {
			return filepath.Join(u.HomeDir, rest)
		}
	}
	return p
}
