package seal

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
)

func newKey(t testing.TB) ed25519.PrivateKey {
	_, k, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// admitted is an invocation as authorize hands it on, sealed, then sent
// through a hop's JSON encoding and decoding and given route's decision.
func admitted(t testing.TB, s *Sealer, exp time.Time) *envelope.Invocation {
	inv := &envelope.Invocation{
		ID: "inv-1", Tenant: "demo", Event: envelope.Event{ID: "inv-1", Seq: 42},
		Request: &api.Request{ToolID: "fs.read_file", ToolVersion: "^1",
			Parameters:     json.RawMessage(`{"path": "a<b>&c.txt", "n": 1.50, "u": "\u00e9"}`),
			AgentContext:   api.AgentContext{AgentDID: "did:agent:a", TenantID: "demo", SessionID: "s1"},
			ResourceLimits: &api.ResourceLimits{TimeoutSeconds: 10}},
		Authz: &envelope.Authorization{TokenID: "tok-1", AgentDID: "did:agent:a", Session: "root-1", Reserved: true,
			Grants: envelope.Grants{Paths: []string{"/reports"}, PathMode: "ro", Hosts: []string{"api.example.com"}, Ports: []int{443}}},
		Principal: &envelope.Principal{Session: "root-1",
			Claims: json.RawMessage(`{"tenant_id":"demo","sub":"did:agent:a","jti":"tok-1","roles":["reader"]}`)},
	}
	if err := s.Seal(inv, "fs.read_file", "1.2.0", exp); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	var out envelope.Invocation
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	out.Route = &envelope.Route{ToolID: "fs.read_file", ToolVersion: "1.2.0", Executor: "builtin"}
	return &out
}

func TestSealVerifiesAfterAHop(t *testing.T) {
	k := newKey(t)
	inv := admitted(t, NewSealer(k), time.Now().Add(time.Hour))
	if err := NewVerifier(k.Public().(ed25519.PublicKey)).Check(inv, time.Now()); err != nil {
		t.Fatalf("a genuine seal: %v", err)
	}
}

// TestCheckRefuses: every change to a sealed field after authorize, a
// missing or foreign seal and an expired one are refused with E3218 naming
// what was wrong.
func TestCheckRefuses(t *testing.T) {
	k := newKey(t)
	s, v := NewSealer(k), NewVerifier(k.Public().(ed25519.PublicKey))
	now := time.Now()
	other := NewSealer(newKey(t))
	cases := []struct {
		name   string
		change func(inv *envelope.Invocation)
		sealer *Sealer
		field  string
	}{
		{"no seal", func(inv *envelope.Invocation) { inv.Authz.Seal = nil }, s, ""},
		{"no authorization", func(inv *envelope.Invocation) { inv.Authz = nil }, s, ""},
		{"sealed by another key", nil, other, "key"},
		{"another key's seal relabelled", func(inv *envelope.Invocation) { inv.Authz.Seal.Key = NewSealer(k).id }, other, "sig"},
		{"signature garbled", func(inv *envelope.Invocation) { inv.Authz.Seal.Sig = "AAAA" }, s, "sig"},
		{"sealed field rewritten with its envelope", func(inv *envelope.Invocation) {
			inv.Authz.Seal.ToolID, inv.Route.ToolID = "fs.write_file", "fs.write_file"
		}, s, "sig"},
		{"another tenant", func(inv *envelope.Invocation) { inv.Tenant = "other" }, s, "tenant"},
		{"another invocation", func(inv *envelope.Invocation) { inv.ID = "inv-2" }, s, "id"},
		{"another ingest sequence", func(inv *envelope.Invocation) { inv.Event.Seq = 43 }, s, "seq"},
		{"another tool", func(inv *envelope.Invocation) { inv.Route.ToolID = "fs.write_file" }, s, "tool"},
		{"another version", func(inv *envelope.Invocation) { inv.Route.ToolVersion = "1.3.0" }, s, "tool"},
		{"other parameters", func(inv *envelope.Invocation) { inv.Request.Parameters = json.RawMessage(`{"path":"/etc/passwd"}`) }, s, "request"},
		{"other limits", func(inv *envelope.Invocation) { inv.Request.ResourceLimits = nil }, s, "request"},
		{"another agent context", func(inv *envelope.Invocation) { inv.Request.AgentContext.SessionID = "s2" }, s, "request"},
		{"wider path grant", func(inv *envelope.Invocation) { inv.Authz.Grants.Paths = []string{"/"} }, s, "authz"},
		{"another host grant", func(inv *envelope.Invocation) {
			inv.Authz.Grants.Hosts = append(inv.Authz.Grants.Hosts, "evil.example")
		}, s, "authz"},
		{"another budget", func(inv *envelope.Invocation) { inv.Authz.Session = "victim" }, s, "authz"},
		{"a forged approver", func(inv *envelope.Invocation) { inv.Authz.ApprovedBy = "operator:alice" }, s, "authz"},
		{"expired", func(inv *envelope.Invocation) {}, nil, "exp"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			exp := now.Add(time.Hour)
			sealer := tc.sealer
			if sealer == nil {
				sealer, exp = s, now.Add(-time.Second)
			}
			inv := admitted(t, sealer, exp)
			if tc.change != nil {
				tc.change(inv)
			}
			err := v.Check(inv, now)
			if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EHopUnsealed}) {
				t.Fatalf("err %v, want permission_denied E3218", err)
			}
			var te *api.Error
			errors.As(err, &te)
			if got, _ := te.Details["sealed_field"].(string); got != tc.field {
				t.Errorf("sealed_field %q, want %q (%v)", got, tc.field, err)
			}
		})
	}
}

// TestSealCoversThePrincipal: the seal's one signature vouches for the
// principal authorize verified; a principal changed by a later hop (any
// byte of its claims, its session), or the seal of another invocation,
// tenant or key, is not vouched for. A seal made before seals covered the
// principal still admits its call at execute, and vouches for no
// principal.
func TestSealCoversThePrincipal(t *testing.T) {
	k := newKey(t)
	s, v := NewSealer(k), NewVerifier(k.Public().(ed25519.PublicKey))
	exp := time.Now().Add(time.Hour)
	if inv := admitted(t, s, exp); !v.Principal(inv, inv.Authz.Seal) {
		t.Fatal("the principal of a genuine seal is not vouched for")
	}
	for name, change := range map[string]func(inv *envelope.Invocation){
		"another agent": func(inv *envelope.Invocation) {
			inv.Principal.Claims = json.RawMessage(strings.Replace(string(inv.Principal.Claims), "did:agent:a", "did:agent:b", 1))
		},
		"another token id": func(inv *envelope.Invocation) {
			inv.Principal.Claims = json.RawMessage(strings.Replace(string(inv.Principal.Claims), "tok-1", "tok-2", 1))
		},
		"other roles": func(inv *envelope.Invocation) {
			inv.Principal.Claims = json.RawMessage(strings.Replace(string(inv.Principal.Claims), "reader", "admin", 1))
		},
		"another session":       func(inv *envelope.Invocation) { inv.Principal.Session = "victim" },
		"another tenant":        func(inv *envelope.Invocation) { inv.Tenant = "other" },
		"another invocation":    func(inv *envelope.Invocation) { inv.ID = "inv-2" },
		"no principal digest":   func(inv *envelope.Invocation) { inv.Authz.Seal.Principal = "" },
		"the digest rewritten":  func(inv *envelope.Invocation) { inv.Authz.Seal.Principal = principalDigest(inv) + "0" },
		"another key's seal":    func(inv *envelope.Invocation) { inv.Authz.Seal = admitted(t, NewSealer(newKey(t)), exp).Authz.Seal },
		"the signature garbled": func(inv *envelope.Invocation) { inv.Authz.Seal.Sig = "AAAA" },
	} {
		inv := admitted(t, s, exp)
		change(inv)
		if v.Principal(inv, inv.Authz.Seal) {
			t.Errorf("%s: vouched for", name)
		}
	}
	// Sealed without a principal, as before seals covered it.
	old := admitted(t, s, exp)
	p := old.Principal
	old.Principal = nil
	if err := s.Seal(old, "fs.read_file", "1.2.0", exp); err != nil {
		t.Fatal(err)
	}
	if err := v.Check(old, time.Now()); err != nil {
		t.Fatalf("a seal without the principal's digest: %v", err)
	}
	if old.Principal = p; v.Principal(old, old.Authz.Seal) {
		t.Fatal("a seal without the principal's digest vouches for a principal")
	}
}

// BenchmarkSeal and BenchmarkCheck are the cost per admitted call: one
// signature in authorize, one verification in execute.
func BenchmarkSeal(b *testing.B) {
	k := newKey(b)
	s := NewSealer(k)
	inv := admitted(b, s, time.Now().Add(time.Hour))
	for b.Loop() {
		if err := s.Seal(inv, "fs.read_file", "1.2.0", time.Now().Add(time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	k := newKey(b)
	v := NewVerifier(k.Public().(ed25519.PublicKey))
	inv := admitted(b, NewSealer(k), time.Now().Add(time.Hour))
	now := time.Now()
	for b.Loop() {
		if err := v.Check(inv, now); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckOurs is execute's check of a seal made in its own process
// (serve): the seal found in its Sealer's memory, the digests recomputed.
func BenchmarkCheckOurs(b *testing.B) {
	s := NewSealer(newKey(b))
	v := s.Verifier()
	inv := admitted(b, s, time.Now().Add(time.Hour))
	sl := *inv.Authz.Seal
	now := time.Now()
	for b.Loop() {
		s.made.remember(sl.Sig, sl, 0)
		if err := v.Check(inv, now); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSignedText: the signed text's layout, which seals made by other
// builds are verified against, stays the same.
func TestSignedText(t *testing.T) {
	sl := &envelope.Seal{Key: "NKEY", Tenant: "de\"mo", ID: "inv-1", Seq: 42, ToolID: "fs.read_file", ToolVersion: "1.2.0",
		Request: "r", Authz: "a\n", Decision: DecisionAllow, Expires: -5}
	want := "toolgate-seal-v1\n\"NKEY\"\n\"de\\\"mo\"\n\"inv-1\"\n\"fs.read_file\"\n\"1.2.0\"\n\"r\"\n\"a\\n\"\n\"allow\"\n42\n-5"
	if got := string(signed(sl)); got != want {
		t.Fatalf("signed text\n%s\nwant\n%s", got, want)
	}
}

// TestCheckRefusesAChangeInPlace: in one process (serve), a request or
// authorization changed in place after the seal, with no hop between to
// decode it afresh, is refused as a changed one sent over the bus is.
func TestCheckRefusesAChangeInPlace(t *testing.T) {
	cases := []struct {
		name   string
		change func(inv *envelope.Invocation)
		field  string
	}{
		{"parameters replaced", func(inv *envelope.Invocation) { inv.Request.Parameters = json.RawMessage(`{"path":"/etc/passwd"}`) }, "request"},
		{"a limit deep within", func(inv *envelope.Invocation) { inv.Request.ResourceLimits.TimeoutSeconds = 3600 }, "request"},
		{"a grant written over", func(inv *envelope.Invocation) { inv.Authz.Grants.Paths[0] = "/" }, "authz"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := NewSealer(newKey(t))
			v := s.Verifier()
			inv := admitted(t, s, time.Now().Add(time.Hour))
			if err := s.Seal(inv, "fs.read_file", "1.2.0", time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
			sl := inv.Authz.Seal
			tc.change(inv)
			var te *api.Error
			if err := v.Check(inv, time.Now()); !errors.As(err, &te) || te.Details["sealed_field"] != tc.field {
				t.Fatalf("err %v, want E3218 naming %s", err, tc.field)
			}
			if inv.Authz.Seal != sl {
				t.Fatal("the check left the authorization without its seal")
			}
		})
	}
}

// TestSealMemory: execute answers a seal authorize made in the same
// process from memory, without verifying it, only when it is that seal
// byte for byte; a seal altered in any field, signed by another key or
// read again is verified, and one from another process verifies.
func TestSealMemory(t *testing.T) {
	verifications := countVerify(t)
	k := newKey(t)
	s := NewSealer(k)
	exp := time.Now().Add(time.Hour)
	check := func(name string, v *Verifier, inv *envelope.Invocation, wantErr bool, wantVerify int64) {
		t.Helper()
		before := verifications.Load()
		if err := v.Check(inv, time.Now()); (err != nil) != wantErr {
			t.Errorf("%s: err %v, want error %v", name, err, wantErr)
		}
		if got := verifications.Load() - before; got != wantVerify {
			t.Errorf("%s: %d verifications, want %d", name, got, wantVerify)
		}
	}
	inv := admitted(t, s, exp)
	check("made here", s.Verifier(), inv, false, 0)
	check("read again", s.Verifier(), inv, false, 1)
	check("made by another process with the key", s.Verifier(), admitted(t, NewSealer(k), exp), false, 1)

	// Every field of the seal, each altered in turn.
	fields := reflect.TypeFor[envelope.Seal]()
	for i := range fields.NumField() {
		inv := admitted(t, s, exp)
		f := reflect.ValueOf(inv.Authz.Seal).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			// One character for another of base64's alphabet, so that an
			// altered signature still decodes and reaches the check.
			b := []byte(f.String())
			if b[len(b)/2] == 'A' {
				b[len(b)/2] = 'B'
			} else {
				b[len(b)/2] = 'A'
			}
			f.SetString(string(b))
		case reflect.Uint64:
			f.SetUint(f.Uint() + 1)
		case reflect.Int64:
			f.SetInt(f.Int() - 1)
		default:
			t.Fatalf("field %s of kind %s is not altered here", fields.Field(i).Name, f.Kind())
		}
		want := int64(1)
		if fields.Field(i).Name == "Key" { // refused before its signature
			want = 0
		}
		check("altered "+fields.Field(i).Name, s.Verifier(), inv, true, want)
	}

	// Signed by another key, in this process, naming this one.
	other := NewSealer(newKey(t))
	other.id = s.id
	check("signed by another key", s.Verifier(), admitted(t, other, exp), true, 1)

	for range maxMade + 1 {
		admitted(t, s, exp)
	}
	if n := len(s.made.made); n > maxMade {
		t.Errorf("%d seals remembered", n)
	}
}
