package subjects

import (
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

func TestTokenRoundTrip(t *testing.T) {
	for _, s := range []string{"", "abc", "mcp:fs:read_file", "a.b.c", "x=y", "*", ">", "ünï", "a b\tc", "=3A"} {
		tok := Token(s)
		back, err := Untoken(tok)
		if err != nil || back != s {
			t.Fatalf("Untoken(Token(%q)) = %q, %v", s, back, err)
		}
	}
}

func TestUntokenRejectsNonCanonical(t *testing.T) {
	for _, tok := range []string{"=3a", "=41", "=4", "a.b", "a*"} {
		if _, err := Untoken(tok); err == nil {
			t.Fatalf("Untoken(%q) accepted a non-canonical token", tok)
		}
	}
}

func TestPipelineOrder(t *testing.T) {
	got := []string{}
	for s := Validate; s != ""; s = Next(s) {
		got = append(got, s)
	}
	if strings.Join(got, ",") != "validate,authorize,route,execute,verify,audit" {
		t.Fatalf("pipeline order %v", got)
	}
}

func TestInputsDoNotOverlap(t *testing.T) {
	// Work-queue streams allow one consumer per subject: filters must be disjoint.
	var all []Input
	for _, s := range Stages {
		all = append(all, Inputs(s)...)
	}
	for i, a := range all {
		for j, b := range all {
			if i != j && a.Stream == b.Stream && server.SubjectsCollide(a.Filter, b.Filter) {
				t.Fatalf("filters of %s and %s overlap: %s %s", a.Consumer, b.Consumer, a.Filter, b.Filter)
			}
		}
	}
	for i, p := range Priorities {
		if !server.SubjectMatchesFilter(Pipe(Route, p, "acme"), Inputs(Route)[i].Filter) {
			t.Fatalf("route's %s filter does not match its pipe subject", p)
		}
	}
	if Pipe(Route, "", "acme") != Pipe(Route, PriorityNormal, "acme") || Pipe(Route, "urgent!", "a") != Pipe(Route, PriorityNormal, "a") {
		t.Fatal("an absent or unknown priority is not normal")
	}
}

// FuzzResultSubject checks the subject builder against nats-server's own
// validator: any tenant token, agent and id make one valid literal subject
// whose last two tokens decode back to the agent and the id, which the
// agent's own filter matches and another agent's does not.
func FuzzResultSubject(f *testing.F) {
	f.Add("acme", "did:example:a", "0b9c1e4e-7c1a-4bd3-9d2e-3f6a2c1d9e10")
	f.Add("t", "", "a.b*>c d")
	f.Fuzz(func(t *testing.T, tenant, agent, id string) {
		if !server.IsValidLiteralSubject(Invoke(tenant)) || strings.Contains(tenant, ".") {
			return // the tenant comes from a subject token, so it is valid by construction
		}
		s := Result(tenant, agent, id)
		if !server.IsValidLiteralSubject(s) {
			t.Fatalf("Result(%q, %q, %q) = %q is not a valid subject", tenant, agent, id, s)
		}
		gotTenant, gotAgent, gotID, ok := ParseResult(s)
		if !ok || gotTenant != tenant || gotAgent != agent || gotID != id {
			t.Fatalf("%q parsed as %q %q %q %v", s, gotTenant, gotAgent, gotID, ok)
		}
		if !server.SubjectMatchesFilter(s, ResultAgent(tenant, agent)) || !server.SubjectMatchesFilter(s, ResultTenant(tenant)) ||
			!server.SubjectMatchesFilter(s, ResultAnyAgent(tenant, id)) {
			t.Fatalf("%q escapes its own filters", s)
		}
		if server.SubjectMatchesFilter(s, ResultAgent(tenant, agent+"x")) {
			t.Fatalf("%q matches another agent's filter", s)
		}
	})
}

// TestAdminServicesAreNotTenantScoped: no administrative endpoint is matched
// by a tenant-scoped endpoint's subscription (tool.svc.*.<endpoint>), so no
// tenant's name can make an agent's allowed subject an administrative one.
func TestAdminServicesAreNotTenantScoped(t *testing.T) {
	scoped := TenantServices
	if len(scoped) == 0 || len(AdminServices) == 0 {
		t.Fatalf("%d tenant-scoped and %d administrative endpoints", len(scoped), len(AdminServices))
	}
	for _, admin := range AdminServices {
		if !strings.HasPrefix(admin, "tool.svc.") {
			t.Errorf("%s is not under tool.svc.", admin)
		}
		for _, s := range scoped {
			if server.SubjectMatchesFilter(admin, TenantSvc("*", s)) {
				t.Errorf("%s matches the tenant-scoped %s", admin, TenantSvc("*", s))
			}
		}
	}
}

// StageOfPipe names the one stage whose inputs match a hand-off subject.
func TestStageOfPipe(t *testing.T) {
	for _, st := range Stages[1:] {
		for _, p := range Priorities {
			subject := Pipe(st, p, "acme")
			got, ok := StageOfPipe(subject)
			if !ok || got != st {
				t.Errorf("%s: stage %q %v, want %s", subject, got, ok, st)
			}
			for _, other := range Stages {
				reads := false
				for _, in := range Inputs(other) {
					reads = reads || server.SubjectMatchesFilter(subject, in.Filter)
				}
				if reads != (other == st) {
					t.Errorf("%s: read by %s: %v", subject, other, reads)
				}
			}
		}
	}
	for _, s := range []string{Result("acme", "did:agent:a", "a"), Invoke("acme"), Cancel("acme", "a"), "toolgate.pipe.execute", "toolgate.pipe..normal.acme"} {
		if st, ok := StageOfPipe(s); ok {
			t.Errorf("%s: taken for a hand-off to %q", s, st)
		}
	}
}

// FuzzToken holds Token to its spelling, byte by byte: every subject and
// key names an id so, in stored keys and other builds alike.
func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "abc", "did:agent:a", "mcp:fs:read_file", "ünï", "a b", "=3A", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := "="
		if s != "" {
			var b strings.Builder
			for i := 0; i < len(s); i++ {
				if c := s[i]; isPlain(c) {
					b.WriteByte(c)
				} else {
					fmt.Fprintf(&b, "=%02X", c)
				}
			}
			want = b.String()
		}
		if got := Token(s); got != want {
			t.Fatalf("Token(%q) = %q, want %q", s, got, want)
		}
		if back, err := Untoken(Token(s)); err != nil || back != s {
			t.Fatalf("Untoken(Token(%q)) = %q, %v", s, back, err)
		}
	})
}
