package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/internal/busauth"
)

// TestCredsIssuePeopleAndConsole: creds issue writes a named person's
// credentials; the console takes an approver's or an auditor's and refuses
// an admin's or the operator's (E3247) unless --allow-admin, before it
// connects anywhere.
func TestCredsIssuePeopleAndConsole(t *testing.T) {
	dir := t.TempDir()
	if _, err := busauth.WriteCredentials(dir); err != nil {
		t.Fatal(err)
	}
	creds := map[busauth.Role]string{busauth.RoleOperator: filepath.Join(dir, busauth.DirName, busauth.OperatorCredsFile)}
	for _, role := range busauth.PeopleRoles {
		out := filepath.Join(t.TempDir(), string(role)+".creds")
		r := tg(t, "", "--data", dir, "creds", "issue", "--role", string(role), "--name", "pat", "--out", out)
		if r.code != exitOK || !strings.Contains(r.stdout, string(role)+":pat") {
			t.Fatalf("creds issue --role %s: exit %d\n%s%s", role, r.code, r.stdout, r.stderr)
		}
		creds[role] = out
	}
	if r := tg(t, "", "--data", dir, "creds", "issue", "--role", "approver", "--name", "a.b", "--out", filepath.Join(t.TempDir(), "x.creds")); r.code != exitUsage {
		t.Fatalf("creds issue --name a.b: exit %d, want %d\n%s", r.code, exitUsage, r.stderr)
	}
	for role, path := range creds {
		signer, err := busauth.SignerFromCreds(path)
		if err != nil {
			t.Fatal(err)
		}
		refused := role == busauth.RoleAdmin || role == busauth.RoleOperator
		if err := consoleCredentials(signer, false); (err != nil) != refused || (refused && !strings.Contains(err.Error(), "E3247")) {
			t.Errorf("console with %s credentials: %v, want refused %v (E3247)", role, err, refused)
		}
		if err := consoleCredentials(signer, true); err != nil {
			t.Errorf("console --allow-admin with %s credentials: %v", role, err)
		}
		if !refused {
			continue
		}
		r := tg(t, "", "--data", dir, "--nats", "nats://127.0.0.1:1", "console", "--creds", path)
		if r.code == exitOK || !strings.Contains(r.stderr, "E3247") {
			t.Errorf("console --creds %s: exit %d, want E3247\n%s", role, r.code, r.stderr)
		}
	}
	// A worker's credentials are nobody's console.
	signer, err := busauth.SignerFromCreds(filepath.Join(dir, busauth.DirName, busauth.CredsFile(busauth.RoleControl)))
	if err != nil {
		t.Fatal(err)
	}
	if err := consoleCredentials(signer, true); err == nil {
		t.Error("the console took the control service's credentials")
	}
}
