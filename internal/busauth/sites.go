package busauth

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/subjects"
)

// RoleSite is a site's: the leaf-node connection of an execute worker that
// runs where its tools' data lives (docs/sites.md). Its credentials name
// the site; the hub admits them on its leaf-node port only, and grants
// SiteRights of that site, nothing else.
const RoleSite Role = "site"

// SitesFile lists the deployment's sites, one a line (# starts a
// comment), in a data directory's DirName folder. `toolgate site add`
// writes it; a manifest naming a site not in it is refused.
const SitesFile = "sites"

// SiteRights are the rights of site's execute worker: execute's, but its
// pulls are from its own site's consumers only, so that no site takes
// another's calls or the hub's, and without the sweep.
func SiteRights(site string) RoleRights {
	r := Rights[RoleExecute]
	r.Consumes = subjects.SiteInputs(site)
	// No sweep: a message of the pipeline by its sequence may be any
	// call's, so reading or deleting one is the hub's (its execute sweeps
	// the sites' consumers), and so is the state of consumers not its own.
	r.Sweeps, r.Observes = nil, nil
	// What it hands on and relays goes through its own outbox, bounded on
	// its own, which the hub forwards (docs/sites.md).
	r.Outbox = subjects.SiteOutbox(site)
	r.Subscribes = slices.DeleteFunc(slices.Clone(r.Subscribes), func(s string) bool { return s == sitesAdvisories })
	return r
}

// sitesAdvisories are the delivery-limit advisories of every consumer of
// the pipeline: the hub's execute ends the sites' messages that reach it.
var sitesAdvisories = subjects.MaxDeliveriesAdvisory(subjects.Input{Stream: subjects.StreamPipeline, Consumer: "*"})

// SiteRole is the role site's worker signs as, with the site's own key
// (WriteSiteBundle): what it hands on is its site's, not the hub's
// execute's, so no site can pass for another or for the hub.
func SiteRole(site string) Role { return RoleExecute + "@" + Role(site) }

// SiteOfRole returns the site whose worker signs as r, if r is a site's.
func SiteOfRole(r Role) (string, bool) {
	site, ok := strings.CutPrefix(string(r), string(RoleExecute)+"@")
	if !ok || subjects.CheckSite(site) != nil {
		return "", false
	}
	return site, true
}

// RightsOf are role's rights: a stage's or the control service's
// (Rights), or a site's worker's (SiteRights of SiteRole's site).
func RightsOf(role Role) (RoleRights, bool) {
	if site, ok := SiteOfRole(role); ok {
		return SiteRights(site), true
	}
	rr, ok := Rights[role]
	return rr, ok
}

// sitePermissions are the permissions of site's leaf connection.
func sitePermissions(site string) jwt.Permissions {
	p := SiteRights(site).permissionsWithInbox(subjects.SiteInbox(site))
	// Across the link the worker calls the hub's JetStream by its domain's
	// prefix (subjects.HubDomain): the same rights, in that form.
	for _, s := range p.Pub.Allow {
		if d, ok := subjects.HubAPI(s); ok {
			p.Pub.Allow.Add(d)
		}
	}
	return p
}

// LoadSites reads dataDir's SitesFile, sorted and without repeats; a
// missing file names none.
func LoadSites(dataDir string) ([]string, error) {
	return loadNames(dataDir, SitesFile, subjects.CheckSite)
}

// AddSite adds site to dataDir's SitesFile.
func AddSite(dataDir, site string) error {
	if err := subjects.CheckSite(site); err != nil {
		return err
	}
	have, err := LoadSites(dataDir)
	if err != nil {
		return err
	}
	if slices.Contains(have, site) {
		return nil
	}
	have = append(have, site)
	slices.Sort(have)
	return writeSecret(filepath.Join(dataDir, DirName, SitesFile), []byte(strings.Join(have, "\n")+"\n"))
}

// SiteCredsFile is the file of a site's credentials in its bundle's
// DirName folder.
const SiteCredsFile = "site.creds"

// SiteUsersFile records the user (public nkey) of each declared site's
// credentials, "site UKEY" a line, in a data directory's DirName folder:
// the hub admits a site's leaf link only with the credentials of the user
// it was last declared with, and a removed site's with none.
const SiteUsersFile = "sites.users"

// ErrUnknownSite refuses credentials of a site the deployment does not
// (or no longer) declare, or of a user it was not declared with.
var ErrUnknownSite = errors.New("site not declared")

// sitesMu serialises this process's changes of the sites' files.
var sitesMu sync.Mutex

// SiteKeys are what a site's declaration makes at the site's side (toolgate
// site add), of which only the public halves go to the hub: the user of its
// leaf link's credentials and its own signing key (SiteRole's).
type SiteKeys struct {
	user, signing nkeys.KeyPair
}

// NewSiteKeys makes a site's keys.
func NewSiteKeys() (*SiteKeys, error) {
	u, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	sk, err := nkeys.CreatePair(nkeys.PrefixByteServer)
	if err != nil {
		return nil, err
	}
	return &SiteKeys{user: u, signing: sk}, nil
}

// User is the public nkey of the site's credentials' user.
func (k *SiteKeys) User() string { return mustPublic(k.user) }

// Signing is the site's public signing key, as hops.pub lists it.
func (k *SiteKeys) Signing() string { return mustPublic(k.signing) }

// DeclareSite declares site in dataDir (the hub's): its credentials' user
// userPub (SiteUsersFile), its public signing key signPub (hops.pub, as
// SiteRole(site), in place of any earlier one) and its name (SitesFile).
// It returns the user JWT of the site's credentials, signed by the
// deployment's credential signer. Declaring a site again replaces both
// keys: its earlier credentials and key are refused from then on.
func DeclareSite(dataDir, site, userPub, signPub string) (userJWT string, err error) {
	if err := subjects.CheckSite(site); err != nil {
		return "", fmt.Errorf("%w: %v", ErrBadIdentity, err)
	}
	if !nkeys.IsValidPublicUserKey(userPub) {
		return "", fmt.Errorf("%w: the site's user %q is not a public user nkey", ErrBadIdentity, userPub)
	}
	if raw, err := nkeys.Decode(nkeys.PrefixByteServer, []byte(signPub)); err != nil || len(raw) != ed25519.PublicKeySize {
		return "", fmt.Errorf("%w: the site's signing key %q is not a public nkey of prefix N", ErrBadIdentity, signPub)
	}
	keys, err := LoadKeys(dataDir)
	if err != nil {
		return "", fmt.Errorf("the deployment's keys (%s): %w", filepath.Join(dataDir, DirName), err)
	}
	tok, err := keys.userJWT(RoleSite, site, userPub, 0)
	if err != nil {
		return "", err
	}
	sitesMu.Lock()
	defer sitesMu.Unlock()
	if err := setLine(filepath.Join(dataDir, DirName, SiteUsersFile), site, userPub); err != nil {
		return "", err
	}
	if err := setLine(filepath.Join(dataDir, DirName, HopKeysFile), string(SiteRole(site)), signPub); err != nil {
		return "", err
	}
	return tok, AddSite(dataDir, site)
}

// RemoveSite undeclares site in dataDir: its name, its credentials' user
// and its signing key go. ErrUnknownSite when it is not declared.
func RemoveSite(dataDir, site string) error {
	sitesMu.Lock()
	defer sitesMu.Unlock()
	have, err := LoadSites(dataDir)
	if err != nil {
		return err
	}
	if !slices.Contains(have, site) {
		return fmt.Errorf("%w: %q", ErrUnknownSite, site)
	}
	if err := setLine(filepath.Join(dataDir, DirName, SiteUsersFile), site, ""); err != nil {
		return err
	}
	if err := setLine(filepath.Join(dataDir, DirName, HopKeysFile), string(SiteRole(site)), ""); err != nil {
		return err
	}
	have = slices.DeleteFunc(have, func(s string) bool { return s == site })
	return writeSecret(filepath.Join(dataDir, DirName, SitesFile), []byte(strings.Join(have, "\n")+"\n"))
}

// CheckSiteUser reports whether dataDir declares site with user (the
// public nkey of the credentials a leaf link presents): ErrUnknownSite
// if not. A site declared before the hub recorded its user (no line in
// SiteUsersFile) is admitted with any credentials the hub signed for it.
func CheckSiteUser(dataDir, site, user string) error {
	sites, err := LoadSites(dataDir)
	if err != nil {
		return err
	}
	if !slices.Contains(sites, site) {
		return fmt.Errorf("%w: %q is not declared at this hub (toolgate site add)", ErrUnknownSite, site)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, SiteUsersFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, key, ok := strings.Cut(strings.TrimSpace(line), " "); ok && name == site {
			if key != user {
				return fmt.Errorf("%w: %q was declared again: these are its earlier credentials", ErrUnknownSite, site)
			}
			return nil
		}
	}
	return nil
}

// siteBundleFiles are what a site's execute worker needs of the
// deployment's keys besides its credentials and its own signing key: every
// role's public signing key, its site's among them (to check who sent what
// it reads) and the hop-sealing public key (to open the calls authorize
// sealed). No issuer, account or stage key leaves the hub.
var siteBundleFiles = []string{HopKeysFile, SealPublicFile}

// SiteBundleFiles reads from dataDir (the hub's) the public files a site's
// bundle holds (siteBundleFiles), by name.
func SiteBundleFiles(dataDir string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, f := range siteBundleFiles {
		raw, err := os.ReadFile(filepath.Join(dataDir, DirName, f))
		if err != nil {
			return nil, fmt.Errorf("the site's bundle: %w", err)
		}
		out[f] = raw
	}
	return out, nil
}

// WriteSiteBundle writes site's bundle to out: out/DirName holds its
// credentials (SiteCredsFile, with their .jwt and .nk halves: userJWT, the
// hub's, and k's user seed), its signing key, and files, the hub's public
// siteBundleFiles (SiteBundleFiles). The site runs with --data out.
func WriteSiteBundle(out, site string, k *SiteKeys, userJWT string, files map[string][]byte) (creds string, err error) {
	if err := subjects.CheckSite(site); err != nil {
		return "", err
	}
	dir := filepath.Join(out, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	seed, err := k.signing.Seed()
	if err != nil {
		return "", err
	}
	if err := writeSecret(filepath.Join(dir, HopKeyFile(SiteRole(site))), seed); err != nil {
		return "", err
	}
	for _, f := range siteBundleFiles {
		raw, ok := files[f]
		if !ok {
			return "", fmt.Errorf("the site's bundle: the hub sent no %s", f)
		}
		if f == HopKeysFile {
			if _, err := ParseHopPublicKeys(bytes.NewReader(raw)); err != nil {
				return "", err
			}
		}
		if err := writeSecret(filepath.Join(dir, f), raw); err != nil {
			return "", err
		}
	}
	useed, err := k.user.Seed()
	if err != nil {
		return "", err
	}
	b, err := jwt.FormatUserConfig(userJWT, useed)
	if err != nil {
		return "", err
	}
	creds = filepath.Join(dir, SiteCredsFile)
	return creds, WriteCredsFiles(creds, b)
}

// setLine sets the line of key in the "key value" file p to value, in
// place of the one it had; value "" removes it.
func setLine(p, key, value string) error {
	b, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var keep []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if k, _, _ := strings.Cut(strings.TrimSpace(line), " "); line != "" && k != key {
			keep = append(keep, line)
		}
	}
	if value != "" {
		keep = append(keep, key+" "+value)
	}
	return writeSecret(p, []byte(strings.Join(keep, "\n")+"\n"))
}
