package busauth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/subjects"
)

// Files in a data directory's DirName folder.
const (
	DirName           = "busauth"
	issuerFile        = "issuer.nk"      // account key signing callout responses
	credSignerFile    = "cred-signer.nk" // account key signing the roles' user JWTs
	calloutUserFile   = "callout.nk"     // user key the callout service connects with (account AUTH)
	systemUserFile    = "system.nk"      // user key of the system account (kicks revoked clients)
	xkeyFile          = "xkey.nk"        // curve key encrypting callout requests and responses
	AuthConfFile      = "auth.conf"      // accounts and authorization blocks for nats-server
	ControlCredsFile  = "control.creds"
	OperatorCredsFile = "operator.creds"
)

// CredsFile is the name of the credentials file WriteCredentials writes
// for role: <role>.creds.
func CredsFile(role Role) string { return string(role) + ".creds" }

// Keys are the secrets of a deployment's bus authentication.
type Keys struct {
	// Issuer signs the callout's answers; its public key is the server's
	// auth_callout issuer.
	Issuer nkeys.KeyPair
	// CredSigner signs the user JWTs of worker and operator credentials.
	CredSigner nkeys.KeyPair
	// CalloutUser is the nkey user the callout service connects as; it is
	// one of the server's auth_users.
	CalloutUser nkeys.KeyPair
	// SystemUser is a user of the system account, for kicking connections.
	SystemUser nkeys.KeyPair
	// XKey encrypts callout traffic (auth_callout xkey).
	XKey nkeys.KeyPair
}

// GenerateKeys makes a fresh set.
func GenerateKeys() (*Keys, error) {
	var k Keys
	var err error
	if k.Issuer, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	if k.CredSigner, err = nkeys.CreateAccount(); err != nil {
		return nil, err
	}
	if k.CalloutUser, err = nkeys.CreateUser(); err != nil {
		return nil, err
	}
	if k.SystemUser, err = nkeys.CreateUser(); err != nil {
		return nil, err
	}
	if k.XKey, err = nkeys.CreateCurveKeys(); err != nil {
		return nil, err
	}
	return &k, nil
}

func (k *Keys) files() []struct {
	name string
	kp   *nkeys.KeyPair
	pfx  nkeys.PrefixByte
} {
	return []struct {
		name string
		kp   *nkeys.KeyPair
		pfx  nkeys.PrefixByte
	}{
		{issuerFile, &k.Issuer, nkeys.PrefixByteAccount},
		{credSignerFile, &k.CredSigner, nkeys.PrefixByteAccount},
		{calloutUserFile, &k.CalloutUser, nkeys.PrefixByteUser},
		{systemUserFile, &k.SystemUser, nkeys.PrefixByteUser},
		{xkeyFile, &k.XKey, nkeys.PrefixByteCurve},
	}
}

// LoadKeys reads the keys from dataDir/busauth.
func LoadKeys(dataDir string) (*Keys, error) {
	dir := filepath.Join(dataDir, DirName)
	var k Keys
	for _, f := range k.files() {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil {
			return nil, fmt.Errorf("reading bus key: %w", err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
		if err != nil {
			return nil, fmt.Errorf("bus key %s: %w", f.name, err)
		}
		pub, err := kp.PublicKey()
		if err != nil || nkeys.Prefix(pub) != f.pfx {
			return nil, fmt.Errorf("bus key %s is not of the expected kind", f.name)
		}
		*f.kp = kp
	}
	return &k, nil
}

// LoadOrCreateKeys reads the keys, generating and writing them (0600, in a
// 0700 folder) when the folder holds none.
func LoadOrCreateKeys(dataDir string) (*Keys, error) {
	k, err := LoadKeys(dataDir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	if k, err = GenerateKeys(); err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, f := range k.files() {
		seed, err := (*f.kp).Seed()
		if err != nil {
			return nil, err
		}
		if err := writeSecret(filepath.Join(dir, f.name), append(seed, '\n')); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// writeSecret writes b to path with mode 0600, replacing it atomically.
func writeSecret(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func mustPublic(kp nkeys.KeyPair) string {
	p, err := kp.PublicKey()
	if err != nil {
		panic(err) // a KeyPair made by nkeys always has a public key
	}
	return p
}

// roleTag marks a toolgate-issued user JWT with its role.
const roleTagPrefix = "toolgate-role:"

// roleOf is the role a toolgate-issued user JWT names ("" for none).
func roleOf(uc *jwt.UserClaims) Role {
	var r Role
	for _, t := range uc.Tags {
		if v, ok := strings.CutPrefix(t, roleTagPrefix); ok {
			r = Role(v)
		}
	}
	return r
}

// IssueCredentials returns a .creds file (user JWT and nkey seed, the
// format of jwt.FormatUserConfig, which `nats --creds` and
// nats.UserCredentials read) for a worker, an operator or a person (an
// approver, auditor or admin) called name. ttl 0 never expires.
func (k *Keys) IssueCredentials(role Role, name string, ttl time.Duration) ([]byte, error) {
	if !role.Issued() {
		return nil, fmt.Errorf("%w: credentials are for workers, the control service, operators and people, not %q", ErrBadIdentity, role)
	}
	if name == "" || strings.ContainsAny(name, ": \t\r\n") {
		return nil, fmt.Errorf("%w: credential name %q", ErrBadIdentity, name)
	}
	if role == RoleSite {
		if err := subjects.CheckSite(name); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadIdentity, err)
		}
	}
	if role.Person() {
		// A person's name is a token of its inbox prefix (PersonInbox).
		if err := checkToken("name", name); err != nil {
			return nil, err
		}
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	tok, err := k.userJWT(role, name, mustPublic(ukp), ttl)
	if err != nil {
		return nil, err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(tok, seed)
}

// userJWT is the user JWT of role's user called name whose nkey is
// userPub, signed by the credential signer.
func (k *Keys) userJWT(role Role, name, userPub string, ttl time.Duration) (string, error) {
	uc := jwt.NewUserClaims(userPub)
	uc.Name = name
	uc.Tags.Add(roleTagPrefix + string(role))
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	// The permissions in this JWT are not used: the callout grants the
	// role's. Deny all here so the file grants nothing if misused elsewhere.
	uc.Pub.Deny.Add(">")
	uc.Sub.Deny.Add(">")
	return uc.Encode(k.CredSigner)
}

// WriteCredentials makes sure dataDir/busauth holds the keys (the
// hop-sealing key, the message-signing keys, the token key and the audit
// chain key too), and writes one <role>.creds file per issued role
// (each stage's, control's and the operator's), named "local" (and their
// halves <role>.jwt and <role>.nk for the nats CLI), all 0600, and
// auth.conf there, with an account for each tenant of TenantsFile. Existing keys
// are kept, and so are credentials files these keys still admit: what a
// user exported from them (NATS_TOKEN) works after a restart.
// RotateCredentials issues them anew. It returns the keys.
func WriteCredentials(dataDir string) (*Keys, error) { return writeCredentials(dataDir, false) }

// RotateCredentials is WriteCredentials issuing every role's credentials
// files anew. The earlier ones stay valid until they expire (the local
// ones never do) or the credential signer changes: rotation replaces what
// the data directory hands out, it revokes nothing.
func RotateCredentials(dataDir string) (*Keys, error) { return writeCredentials(dataDir, true) }

// admits reports whether the credentials files of role at path (the
// .creds and its .jwt and .nk halves) exist, agree, and are still admitted
// with keys k: signed by its credential signer for that role, unexpired.
func (k *Keys) admits(path string, role Role) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	tok, seed, err := SplitCreds(b)
	if err != nil {
		return false
	}
	base := strings.TrimSuffix(path, ".creds")
	j, err := os.ReadFile(base + ".jwt")
	if err != nil || strings.TrimSpace(string(j)) != tok {
		return false
	}
	if nk, err := os.ReadFile(base + ".nk"); err != nil || string(nk) != string(seed) {
		return false
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil || uc.Issuer != mustPublic(k.CredSigner) || roleOf(uc) != role {
		return false
	}
	return uc.Expires == 0 || time.Now().Before(time.Unix(uc.Expires, 0))
}

func writeCredentials(dataDir string, rotate bool) (*Keys, error) {
	k, err := LoadOrCreateKeys(dataDir)
	if err != nil {
		return nil, err
	}
	if _, err := LoadOrCreateSealKey(dataDir); err != nil {
		return nil, err
	}
	if err := LoadOrCreateHopKeys(dataDir); err != nil {
		return nil, err
	}
	if _, err := LoadOrCreateAuditChainKey(dataDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, DirName)
	// The single worker role of earlier versions grants nothing now.
	for _, ext := range []string{".creds", ".jwt", ".nk"} {
		_ = os.Remove(filepath.Join(dir, "worker"+ext))
	}
	for _, role := range IssuedRoles {
		path := filepath.Join(dir, CredsFile(role))
		if !rotate && k.admits(path, role) {
			continue
		}
		b, err := k.IssueCredentials(role, "local", 0)
		if err != nil {
			return nil, err
		}
		if err := WriteCredsFiles(path, b); err != nil {
			return nil, err
		}
	}
	if err := WriteAuthConf(dataDir, k); err != nil {
		return nil, err
	}
	return k, nil
}

// WriteAuthConf writes dataDir/busauth/auth.conf (0600): the server
// configuration of keys k, with an account for each tenant of TenantsFile.
func WriteAuthConf(dataDir string, k *Keys) error {
	tenants, err := LoadTenants(dataDir)
	if err != nil {
		return err
	}
	return writeSecret(filepath.Join(dataDir, DirName, AuthConfFile), []byte(ServerConfig(k.Public(), tenants)))
}

// WriteCredsFiles writes a .creds file to path (0600) and, beside it, its
// halves for the nats CLI: <name>.jwt (the user JWT) and <name>.nk (the
// nkey seed), used as --nkey <name>.nk --token "$(cat <name>.jwt)" (see
// CredentialsOption).
func WriteCredsFiles(path string, creds []byte) error {
	tok, seed, err := SplitCreds(creds)
	if err != nil {
		return err
	}
	if err := writeSecret(path, creds); err != nil {
		return err
	}
	base := strings.TrimSuffix(path, ".creds")
	if err := writeSecret(base+".jwt", []byte(tok+"\n")); err != nil {
		return err
	}
	// The seed alone, no newline: nkeys.js (the nats CLI's JavaScript
	// peers) refuses a seed file with one.
	return writeSecret(base+".nk", seed)
}

// SplitCreds returns the user JWT and the nkey seed of a .creds file.
func SplitCreds(creds []byte) (string, []byte, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", nil, err
	}
	kp, err := jwt.ParseDecoratedNKey(creds)
	if err != nil {
		return "", nil, err
	}
	seed, err := kp.Seed()
	return tok, seed, err
}

// WriteSeed writes an nkey seed file as WriteCredsFiles does (0600, no
// newline).
func WriteSeed(path string, seed []byte) error { return writeSecret(path, seed) }

// CredentialsOption authenticates a nats.go connection with a .creds file
// written by IssueCredentials. nats.UserCredentials would send the user JWT
// in the CONNECT's jwt field, which a server configured with accounts (not
// operator mode) discards before its auth callout runs; this option sends
// the user's nkey with its nonce signature and the JWT as the connect
// token. The `nats` CLI equivalent: `--nkey <seed file> --token <jwt>`.
func CredentialsOption(path string) nats.Option {
	return func(o *nats.Options) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("reading credentials: %w", err)
		}
		tok, err := jwt.ParseDecoratedJWT(b)
		if err != nil {
			return fmt.Errorf("credentials %s: %w", path, err)
		}
		kp, err := jwt.ParseDecoratedNKey(b)
		if err != nil {
			return fmt.Errorf("credentials %s: %w", path, err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return err
		}
		o.Nkey = pub
		o.SignatureCB = kp.Sign
		o.Token = tok
		// Each role may read replies only below its own inbox prefix.
		if uc, err := jwt.DecodeUserClaims(tok); err == nil {
			switch r := roleOf(uc); {
			case r.Person():
				o.InboxPrefix = PersonInbox(r, uc.Name)
			case r == RoleSite:
				o.InboxPrefix = subjects.SiteInbox(uc.Name)
			case r.Issued() && r != RoleOperator:
				o.InboxPrefix = RoleInbox(r)
			}
		}
		return nil
	}
}
