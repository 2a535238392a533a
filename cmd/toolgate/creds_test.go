package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/internal/busauth"
)

// TestCredsTenants: declared tenants get their accounts in auth.conf, which
// a server loads; a name that cannot be a tenant is a usage error.
func TestCredsTenants(t *testing.T) {
	dir := t.TempDir()
	if _, err := busauth.WriteCredentials(dir); err != nil {
		t.Fatal(err)
	}
	if r := tg(t, "", "--data", dir, "creds", "tenants", "globex", "acme"); r.code != exitOK || r.stdout != "acme\nglobex\n" {
		t.Fatalf("creds tenants: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "--data", dir, "creds", "tenants", "acme", "initech"); r.code != exitOK || r.stdout != "acme\nglobex\ninitech\n" {
		t.Fatalf("creds tenants again: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := tg(t, "", "--data", dir, "creds", "tenants", "a.b"); r.code != exitUsage {
		t.Fatalf("creds tenants a.b: exit %d, want %d\n%s", r.code, exitUsage, r.stderr)
	}
	conf := filepath.Join(dir, busauth.DirName, busauth.AuthConfFile)
	b, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "globex", "initech"} {
		if !strings.Contains(string(b), busauth.TenantAccount(tenant)+": {") {
			t.Errorf("auth.conf has no account for %s:\n%s", tenant, b)
		}
	}
	o, err := natsserver.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("loading auth.conf: %v", err)
	}
	names := map[string]bool{}
	for _, a := range o.Accounts {
		names[a.Name] = true
	}
	if !names[busauth.TenantAccount("initech")] || names["AGENTS"] {
		t.Errorf("accounts %v", names)
	}
}
