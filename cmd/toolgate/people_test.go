package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestCredsApproverApproves: a named approver lists, shows and approves a
// parked call from the command line, recorded as approver:<name>; an
// auditor's approve is refused (E3221 by the bus) and so is an approver's
// policy push.
func TestCredsApproverApproves(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	registerConsoleTool(t, s) // needs.human: every call waits for a person
	issue := func(role, name string) string {
		out := filepath.Join(t.TempDir(), name+".creds")
		if r := tg(t, "", "--data", s.data, "creds", "issue", "--role", role, "--name", name, "--out", out); r.code != exitOK {
			t.Fatalf("creds issue: exit %d\n%s", r.code, r.stderr)
		}
		return out
	}
	alice, carol := issue("approver", "alice"), issue("auditor", "carol")
	id := "people-cli-1"
	finished := parkCall(t, s, id)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		r := tg(t, "", s.flags("approvals", "list", "--tenant", "demo", "--creds", alice)...)
		if strings.Contains(r.stdout, id) {
			break
		}
		if time.Now().After(deadline) {
			op := tg(t, "", s.flags("approvals", "list", "--tenant", "demo")...)
			select {
			case code := <-finished:
				t.Logf("the call ended: %d", code)
			default:
			}
			t.Fatalf("the parked call is not in alice's list: exit %d\n%s%s\noperator's: %s%s", r.code, r.stdout, r.stderr, op.stdout, op.stderr)
		}
	}
	if r := tg(t, "", s.flags("approve", id, "--tenant", "demo", "--creds", carol)...); r.code != exitNotPermitted {
		t.Fatalf("the auditor's approve: exit %d, want %d\n%s%s", r.code, exitNotPermitted, r.stdout, r.stderr)
	}
	if r := tg(t, "", s.flags("policy", "show", "--creds", alice)...); r.code != exitNotPermitted {
		t.Fatalf("the approver's policy show: exit %d, want %d\n%s%s", r.code, exitNotPermitted, r.stdout, r.stderr)
	}
	r := tg(t, "", s.flags("approve", id, "--tenant", "demo", "--creds", alice, "--json")...)
	if r.code != exitOK || !strings.Contains(r.stdout, `"decided_by": "approver:alice"`) && !strings.Contains(r.stdout, `"decided_by":"approver:alice"`) {
		t.Fatalf("alice's approve: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if code := <-finished; code != exitOK {
		t.Fatalf("the approved call ended with exit %d", code)
	}
}
