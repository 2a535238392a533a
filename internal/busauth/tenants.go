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
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/subjects"
)

// One account per tenant. Agents of a tenant live in its own account, which
// imports from TOOLGATE exactly that tenant's invoke subject, control
// endpoints, direct reads of results, live results and audit events. A
// reply subject an agent chooses is delivered in its own account only, so
// no request or publish can make toolgate (or JetStream's ack) answer into
// another tenant's inbox: subject permissions restrict what a connection
// publishes on, not where replies to it go.

// TenantsFile lists the tenants an external server has accounts for, one a
// line (# starts a comment), in a data directory's DirName folder.
// WriteCredentials renders their accounts into auth.conf, and the auth
// callout refuses agents of any other tenant (ErrWrongTenant): a server
// configured with accounts cannot create one when a new tenant connects.
// The embedded server needs no list: it creates a tenant's account when
// the tenant's first agent connects (InProcess).
const TenantsFile = "tenants"

// tenantAccountPrefix starts the name of every tenant's account; no other
// account name starts with it.
const tenantAccountPrefix = "TENANT_"

// TenantAccount is the name of tenant's account. A tenant name is a plain
// token ([A-Za-z0-9_-], subjects.CheckTenant), so the name needs no quoting
// in a configuration file.
func TenantAccount(tenant string) string { return tenantAccountPrefix + tenant }

// TenantOfAccount returns the tenant of a tenant account's name.
func TenantOfAccount(account string) (string, bool) {
	t, ok := strings.CutPrefix(account, tenantAccountPrefix)
	return t, ok && t != ""
}

// tenantServices are the subjects of TOOLGATE a tenant's account imports as
// services: requests cross with a private reply subject and a
// Nats-Request-Info header naming the caller (share).
func tenantServices(tenant string) []string {
	out := []string{subjects.Invoke(tenant)}
	for _, svc := range agentServices {
		out = append(out, subjects.TenantSvc(tenant, svc))
	}
	return append(out, directGetResult(tenant))
}

// tenantStreams are the subjects of TOOLGATE a tenant's account imports as
// streams: its live results and audit events.
func tenantStreams(tenant string) []string {
	return []string{resultsOf(tenant), subjects.AuditTenant(tenant)}
}

// resultsOf matches every result subject of tenant.
func resultsOf(tenant string) string {
	return subjects.ResultAll[:len(subjects.ResultAll)-1] + tenant + ".>"
}

// LoadTenants reads the declared tenants of dataDir's TenantsFile, sorted
// and without repeats; a missing file declares none.
func LoadTenants(dataDir string) ([]string, error) {
	return loadNames(dataDir, TenantsFile, subjects.CheckTenant)
}

// loadNames reads a file of names in dataDir's DirName (parseNames); a
// missing file names none.
func loadNames(dataDir, file string, check func(string) error) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, DirName, file))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return parseNames(b, file, check)
}

// ParseTenants reads a TenantsFile: one tenant a line, blank lines and
// # comments ignored. Every name must be a tenant name (subjects.CheckTenant).
func ParseTenants(b []byte) ([]string, error) {
	return parseNames(b, TenantsFile, subjects.CheckTenant)
}

// parseNames reads a file of names, one a line, blank lines and # comments
// ignored, each passing check; sorted, without repeats.
func parseNames(b []byte, file string, check func(string) error) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if err := check(line); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", file, n, err)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// WriteTenants declares tenants in dataDir's TenantsFile (replacing it).
// Run WriteCredentials afterwards to render their accounts into auth.conf.
func WriteTenants(dataDir string, tenants []string) error {
	var b strings.Builder
	b.WriteString("# Tenants whose agents an external server admits (one account each); see docs/security.md.\n")
	tenants = slices.Clone(tenants)
	slices.Sort(tenants)
	for _, t := range slices.Compact(tenants) {
		if err := subjects.CheckTenant(t); err != nil {
			return err
		}
		b.WriteString(t + "\n")
	}
	if err := os.MkdirAll(filepath.Join(dataDir, DirName), 0o700); err != nil {
		return err
	}
	return writeSecret(filepath.Join(dataDir, DirName, TenantsFile), []byte(b.String()))
}

// tenantAccounts creates the accounts of tenants on a running server, each
// once, when the tenant's first agent connects (the embedded server).
type tenantAccounts struct {
	mu    sync.Mutex
	ready sync.Map // tenant -> *server.Account, complete with its imports
}

// get returns tenant's account on s, creating it with its imports first.
// An account is published (ready) only once all its imports are in place,
// so no connection is ever placed in an account that imports too little.
func (ta *tenantAccounts) get(s *server.Server, tenant string) (*server.Account, error) {
	if acc, ok := ta.ready.Load(tenant); ok {
		return acc.(*server.Account), nil
	}
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if acc, ok := ta.ready.Load(tenant); ok {
		return acc.(*server.Account), nil
	}
	acc, err := addTenantAccount(s, tenant)
	if err != nil {
		return nil, err
	}
	ta.ready.Store(tenant, acc)
	return acc, nil
}

// addTenantAccount registers tenant's account on s with its imports from
// TOOLGATE, or completes it when the configuration declared it already.
func addTenantAccount(s *server.Server, tenant string) (*server.Account, error) {
	if err := subjects.CheckTenant(tenant); err != nil {
		return nil, err
	}
	tg, err := s.LookupAccount(AccountToolgate)
	if err != nil {
		return nil, fmt.Errorf("account %s: %w", AccountToolgate, err)
	}
	acc, isNew := s.LookupOrRegisterAccount(TenantAccount(tenant))
	if !isNew {
		// Declared in the configuration, imports and all; anything else
		// (an earlier attempt that failed half-way) is not to be used.
		if n, want := importsFrom(s, acc.Name, AccountToolgate), len(tenantServices(tenant))+len(tenantStreams(tenant)); n != want {
			return nil, fmt.Errorf("account %s exists with %d imports from %s, not its tenant's %d", acc.Name, n, AccountToolgate, want)
		}
		return acc, nil
	}
	for _, subj := range tenantServices(tenant) {
		if err := acc.AddServiceImport(tg, subj, subj); err != nil {
			return nil, fmt.Errorf("account %s importing service %s: %w", acc.Name, subj, err)
		}
		if err := acc.SetServiceImportSharing(tg, subj, true); err != nil {
			return nil, fmt.Errorf("account %s sharing service %s: %w", acc.Name, subj, err)
		}
	}
	for _, subj := range tenantStreams(tenant) {
		if err := acc.AddStreamImport(tg, subj, ""); err != nil {
			return nil, fmt.Errorf("account %s importing stream %s: %w", acc.Name, subj, err)
		}
	}
	return acc, nil
}

// DeclaredTenants is a CalloutConfig.Tenants accepting exactly tenants.
func DeclaredTenants(tenants []string) func(string) bool {
	set := make(map[string]bool, len(tenants))
	for _, t := range tenants {
		set[t] = true
	}
	return func(t string) bool { return set[t] }
}

// importsFrom counts the imports account has from account from.
func importsFrom(s *server.Server, account, from string) int {
	az, err := s.Accountz(&server.AccountzOptions{Account: account})
	if err != nil || az.Account == nil {
		return 0
	}
	n := 0
	for _, im := range az.Account.Imports {
		if im.Account == from {
			n++
		}
	}
	return n
}
