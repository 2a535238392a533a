package busauth

import (
	"bufio"
	"bytes"
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
	return SiteRights(site).permissionsWithInbox(subjects.SiteInbox(site))
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
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		if err := subjects.CheckSite(line); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", SitesFile, n, err)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", SitesFile, err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
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
