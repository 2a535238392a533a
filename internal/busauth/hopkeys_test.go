package busauth

import (
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/subjects"
)

func TestHopKeys(t *testing.T) {
	dir := t.TempDir()
	if err := LoadOrCreateHopKeys(dir); err != nil {
		t.Fatal(err)
	}
	pubs, err := LoadHopPublicKeys(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(pubs) != len(SigningRoles) {
		t.Fatalf("hops.pub lists %d roles, want %d", len(pubs), len(SigningRoles))
	}
	for _, r := range SigningRoles {
		k, err := LoadHopKey(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		if !k.Public().(ed25519.PublicKey).Equal(pubs[r]) {
			t.Errorf("%s: hops.pub does not list its key", r)
		}
		if fi, _ := os.Stat(filepath.Join(dir, DirName, HopKeyFile(r))); fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: key file mode %v", r, fi.Mode().Perm())
		}
	}
	tk, err := LoadTokenKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A second call keeps every key: other hosts trust them.
	if err := LoadOrCreateHopKeys(dir); err != nil {
		t.Fatal(err)
	}
	again, _ := LoadHopPublicKeys(dir)
	tk2, _ := LoadTokenKey(dir)
	for r, k := range pubs {
		if !k.Equal(again[r]) {
			t.Errorf("%s's key changed", r)
		}
	}
	if *tk != *tk2 {
		t.Error("the token key changed")
	}
	// The operator signs nothing on the pipeline, and no key is in a
	// credentials file.
	if _, err := LoadHopKey(dir, RoleOperator); err == nil {
		t.Error("the operator has a message-signing key")
	}
}

func TestParseHopPublicKeys(t *testing.T) {
	for name, in := range map[string]string{
		"not a signing role": "operator NAAAA\n",
		"not a key":          "route XYZ\n",
		"no key":             "route\n",
		"twice":              "", // filled below
	} {
		if name == "twice" {
			dir := t.TempDir()
			if err := LoadOrCreateHopKeys(dir); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(filepath.Join(dir, DirName, HopKeysFile))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			in = string(b) + lines[len(lines)-1] + "\n"
		}
		if _, err := ParseHopPublicKeys(strings.NewReader(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMayPublish(t *testing.T) {
	cases := []struct {
		role    Role
		subject string
		want    bool
	}{
		{RoleRoute, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme"), true},
		{RoleVerify, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme"), false},
		{RoleVerify, subjects.Pipe(subjects.Audit, subjects.PriorityLow, "acme"), true},
		{RoleAudit, subjects.Result("acme", "did:agent:acme", "id-1"), true},
		{RoleExecute, subjects.Result("acme", "did:agent:acme", "id-1"), false},
		{RoleControl, subjects.Cancel("acme", "id-1"), true},
		{RoleExecute, subjects.Cancel("acme", "id-1"), false},
		{RoleOperator, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "acme"), false},
	}
	// Asked twice: the second answer is the remembered one.
	for range 2 {
		for _, tc := range cases {
			if got := MayPublish(tc.role, tc.subject); got != tc.want {
				t.Errorf("MayPublish(%s, %s) = %v, want %v", tc.role, tc.subject, got, tc.want)
			}
		}
	}
	// Past the bound, answers are worked out and not kept.
	before := mayPublishN.Load()
	mayPublishN.Store(mayPublishMax)
	defer mayPublishN.Store(before)
	if !MayPublish(RoleRoute, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "beyond-the-bound")) {
		t.Error("route may hand on to execute for any tenant")
	}
	if _, kept := mayPublish.Load(publishRight{RoleRoute, subjects.Pipe(subjects.Execute, subjects.PriorityNormal, "beyond-the-bound")}); kept {
		t.Error("an answer past the bound was kept")
	}
}

func FuzzParseHopPublicKeys(f *testing.F) {
	f.Add("# c\nroute NAAAA\n")
	f.Fuzz(func(t *testing.T, in string) {
		keys, err := ParseHopPublicKeys(strings.NewReader(in))
		if err == nil {
			for r := range keys {
				if !r.Stage() && r != RoleControl {
					t.Fatalf("accepted a key for %s", r)
				}
			}
		}
	})
}
