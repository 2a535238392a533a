package busauth

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
// another's calls or the hub's.
func SiteRights(site string) RoleRights {
	r := Rights[RoleExecute]
	r.Consumes = subjects.SiteInputs(site)
	return r
}

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

// siteBundleFiles are what a site's execute worker needs of the
// deployment's keys besides its credentials and its own signing key: every
// role's public signing key, its site's among them (to check who sent what
// it reads) and the hop-sealing public key (to open the calls authorize
// sealed). No issuer, account or stage key leaves the hub.
var siteBundleFiles = []string{HopKeysFile, SealPublicFile}

// WriteSiteBundle declares site in dataDir (the hub's) and writes the
// site's bundle to out: out/DirName holds its credentials (SiteCredsFile,
// with their .jwt and .nk halves) and siteBundleFiles. The site runs
// with --data out.
func WriteSiteBundle(dataDir, site, out string) (creds string, err error) {
	if err := subjects.CheckSite(site); err != nil {
		return "", err
	}
	keys, err := LoadKeys(dataDir)
	if err != nil {
		return "", fmt.Errorf("the deployment's keys (%s): %w", filepath.Join(dataDir, DirName), err)
	}
	b, err := keys.IssueCredentials(RoleSite, site, 0)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(out, DirName)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	// The site's own signing key: its private half goes to the site alone,
	// its public half into the hub's hops.pub (a site declared again gets
	// a new one, and its old bundle signs nothing the hub accepts).
	kp, err := nkeys.CreatePair(nkeys.PrefixByteServer)
	if err != nil {
		return "", err
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	if err := writeSecret(filepath.Join(dir, HopKeyFile(SiteRole(site))), seed); err != nil {
		return "", err
	}
	if err := setHopPublicKey(dataDir, SiteRole(site), mustPublic(kp)); err != nil {
		return "", err
	}
	for _, f := range siteBundleFiles {
		raw, err := os.ReadFile(filepath.Join(dataDir, DirName, f))
		if err != nil {
			return "", fmt.Errorf("the site's bundle: %w", err)
		}
		if err := writeSecret(filepath.Join(dir, f), raw); err != nil {
			return "", err
		}
	}
	creds = filepath.Join(dir, SiteCredsFile)
	if err := WriteCredsFiles(creds, b); err != nil {
		return "", err
	}
	return creds, AddSite(dataDir, site)
}

// setHopPublicKey lists role's public signing key in dataDir's hops.pub,
// in place of the one it had.
func setHopPublicKey(dataDir string, role Role, pub string) error {
	p := filepath.Join(dataDir, DirName, HopKeysFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var keep []string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if r, _, _ := strings.Cut(strings.TrimSpace(line), " "); Role(r) != role {
			keep = append(keep, line)
		}
	}
	keep = append(keep, string(role)+" "+pub)
	return writeSecret(p, []byte(strings.Join(keep, "\n")+"\n"))
}
