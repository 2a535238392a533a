package busauth

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/subjects"
)

// Files of the per-role signing keys in a data directory's DirName folder.
// Every stage and the control service signs what it publishes with its own
// key (<role>.hop.nk, an nkeys seed of prefix N); hops.pub lists every
// role's public key, which is all a reader needs to check who sent a
// message. tokens.key is the secret key validate seals capability tokens
// with for authorize, so no other role reads a raw token in flight or at
// rest. None of these is part of a credentials file: a leaked credential
// signs nothing and opens nothing.
const (
	HopKeysFile   = "hops.pub"
	TokenKeyFile  = "tokens.key"
	hopKeySuffix  = ".hop.nk"
	tokenKeyBytes = 32
)

// SigningRoles are the roles that sign what they publish.
var SigningRoles = append(slices.Clone(StageRoles), RoleControl)

// HopKeyFile is the file of role's private signing key.
func HopKeyFile(role Role) string { return string(role) + hopKeySuffix }

// ErrNoHopKeys is returned when a data directory lacks a signing key.
var ErrNoHopKeys = errors.New("no message-signing keys")

// LoadOrCreateHopKeys makes the signing keys of every SigningRole and
// hops.pub, and the token key, in dataDir/busauth where none are there yet.
// A folder that has hops.pub keeps it: a new key there would be one the
// other hosts' readers do not trust.
func LoadOrCreateHopKeys(dataDir string) error {
	dir := filepath.Join(dataDir, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, HopKeysFile)); errors.Is(err, fs.ErrNotExist) {
		var pub strings.Builder
		pub.WriteString("# toolgate message-signing keys: role, public nkey. Generated; see docs/security.md.\n")
		for _, r := range SigningRoles {
			kp, err := nkeys.CreatePair(nkeys.PrefixByteServer)
			if err != nil {
				return err
			}
			seed, err := kp.Seed()
			if err != nil {
				return err
			}
			if err := writeSecret(filepath.Join(dir, HopKeyFile(r)), seed); err != nil {
				return err
			}
			fmt.Fprintf(&pub, "%s %s\n", r, mustPublic(kp))
		}
		if err := writeSecret(filepath.Join(dir, HopKeysFile), []byte(pub.String())); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, TokenKeyFile)); errors.Is(err, fs.ErrNotExist) {
		k := make([]byte, tokenKeyBytes)
		if _, err := rand.Read(k); err != nil {
			return err
		}
		return writeSecret(filepath.Join(dir, TokenKeyFile), []byte(hex.EncodeToString(k)+"\n"))
	} else if err != nil {
		return err
	}
	return nil
}

// LoadHopKey reads role's private signing key from dataDir/busauth.
func LoadHopKey(dataDir string, role Role) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, HopKeyFile(role)))
	if err != nil {
		return nil, fmt.Errorf("reading %s's signing key: %w", role, err)
	}
	pfx, raw, err := nkeys.DecodeSeed(bytes.TrimSpace(b))
	if err != nil || pfx != nkeys.PrefixByteServer {
		return nil, fmt.Errorf("%w: %s is not an nkeys seed of prefix N", ErrNoHopKeys, HopKeyFile(role))
	}
	return ed25519.NewKeyFromSeed(raw), nil
}

// LoadHopPublicKeys reads hops.pub: every signing role's public key.
func LoadHopPublicKeys(dataDir string) (map[Role]ed25519.PublicKey, error) {
	f, err := os.Open(filepath.Join(dataDir, DirName, HopKeysFile))
	if err != nil {
		return nil, fmt.Errorf("reading the message-signing public keys: %w", err)
	}
	defer f.Close()
	return ParseHopPublicKeys(f)
}

// ParseHopPublicKeys reads the hops.pub format: one "role NKEY" a line,
// # comments and blank lines ignored; only signing roles, each once.
func ParseHopPublicKeys(r io.Reader) (map[Role]ed25519.PublicKey, error) {
	out := map[Role]ed25519.PublicKey{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		role, key, ok := strings.Cut(line, " ")
		r := Role(role)
		if _, site := SiteOfRole(r); !ok || !slices.Contains(SigningRoles, r) && !site {
			return nil, fmt.Errorf("%w: %s line %d: want \"<role> <public nkey>\" of a signing role", ErrNoHopKeys, HopKeysFile, n)
		}
		raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(strings.TrimSpace(key)))
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%w: %s line %d: not a public nkey of prefix N", ErrNoHopKeys, HopKeysFile, n)
		}
		if _, dup := out[r]; dup {
			return nil, fmt.Errorf("%w: %s line %d: %s listed twice", ErrNoHopKeys, HopKeysFile, n, role)
		}
		out[r] = ed25519.PublicKey(raw)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// LoadTokenKey reads the key validate seals capability tokens with.
func LoadTokenKey(dataDir string) (*[tokenKeyBytes]byte, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, TokenKeyFile))
	if err != nil {
		return nil, fmt.Errorf("reading the token key: %w", err)
	}
	raw, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(raw) != tokenKeyBytes {
		return nil, fmt.Errorf("%w: %s is not %d bytes in hex", ErrNoHopKeys, TokenKeyFile, tokenKeyBytes)
	}
	return (*[tokenKeyBytes]byte)(raw), nil
}

// MayPublish reports whether role's rights let it publish on subject: what
// a reader checks a signed message's subject against, so a stage's key
// vouches only for what its role may send.
func MayPublish(role Role, subject string) bool {
	k := publishRight{role, subject}
	if ok, seen := mayPublish.Load(k); seen {
		return ok.(bool)
	}
	ok := mayPublishNow(role, subject)
	// Every hop of every call asks: the answers are kept, up to a bound
	// that tenants' subjects cannot push memory past.
	if mayPublishN.Load() < mayPublishMax {
		if _, loaded := mayPublish.LoadOrStore(k, ok); !loaded {
			mayPublishN.Add(1)
		}
	}
	return ok
}

type publishRight struct {
	role    Role
	subject string
}

var (
	mayPublish  sync.Map // publishRight → bool
	mayPublishN atomic.Int64
)

const mayPublishMax = 1 << 14

func mayPublishNow(role Role, subject string) bool {
	rr, ok := RightsOf(role)
	if !ok {
		return false
	}
	for _, p := range rr.Publishes {
		if server.SubjectMatchesFilter(subject, p) {
			return true
		}
	}
	for _, e := range rr.Emits {
		if server.SubjectMatchesFilter(subject, subjects.Relay(e.Subject)) {
			return true
		}
	}
	return false
}
