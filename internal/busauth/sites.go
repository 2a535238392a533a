package busauth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/jwt/v2"
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
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, SitesFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseNames(b, SitesFile, subjects.CheckSite)
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
// deployment's keys besides its credentials: every role's public signing
// key (to check who sent what it reads), execute's own signing key (what
// it hands on is execute's) and the hop-sealing public key (to open the
// calls authorize sealed). No issuer or account key leaves the hub.
var siteBundleFiles = []string{HopKeysFile, HopKeyFile(RoleExecute), SealPublicFile}

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
