package auditchain_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/allocbudget"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/subjects"
)

// receiptEvent publishes the terminal event of invocation id carrying a
// receipt of result, signed with the trail's key, and returns the receipt.
func (tr *trail) receiptEvent(id string, result json.RawMessage) *api.Receipt {
	tr.t.Helper()
	r, subject, data := tr.receiptData(id, result)
	tr.publish(subject, data)
	return r
}

// receiptData is the terminal event of invocation id carrying a receipt of
// result, signed with the trail's key, its subject, and the receipt.
func (tr *trail) receiptData(id string, result json.RawMessage) (*api.Receipt, string, []byte) {
	tr.t.Helper()
	r := &api.Receipt{V: api.ReceiptVersion, InvocationID: id, Tenant: "acme", Agent: "agent-1", ToolID: "echo",
		ToolVersion: "1.0.0", Status: api.StatusSuccess, Decision: "allow", PolicyRevision: 7,
		ParamsSHA256: auditchain.Digest([]byte(`{"message":"hi"}`)), ResultSHA256: auditchain.Digest(result),
		EventID: id + ":tool.succeeded", IssuedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	auditchain.NewReceiptSigner(tr.key).Sign(r)
	data, err := json.Marshal(map[string]any{"specversion": "1.0", "id": r.EventID, "source": "urn:toolgate:audit",
		"type": api.TypeSucceeded, "subject": id, "tenantid": "acme",
		"data": map[string]any{"invocation_id": id, "tenant_id": "acme", "status": "success", "receipt": r}})
	if err != nil {
		tr.t.Fatal(err)
	}
	return r, subjects.AuditEvent("acme", "tool.succeeded"), data
}

func ecodeOf(err error) string {
	var te *api.Error
	if errors.As(err, &te) {
		return te.ECode
	}
	return ""
}

// TestReceiptChecks: a receipt verifies with the chain's public key, its
// result and its proof; one byte changed, another result, another
// event's proof or a proof whose tree was changed are each refused with
// their own code.
func TestReceiptChecks(t *testing.T) {
	tr := newTrail(t)
	pub := tr.key.Public().(ed25519.PublicKey)
	result := json.RawMessage(`{"echo": "hi"}`)
	a := tr.receiptEvent("inv-a", result)
	b := tr.receiptEvent("inv-b", json.RawMessage(`{"echo":"other"}`))
	tr.fill(0, 5)
	tr.flush()
	pa, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, a.EventID, pub)
	if err != nil {
		t.Fatal(err)
	}
	pb, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, b.EventID, pub)
	if err != nil {
		t.Fatal(err)
	}

	if err := auditchain.CheckReceipt(a, pub); err != nil {
		t.Fatalf("the receipt as signed: %v", err)
	}
	// The hash is of the compact JSON: the result as it travels.
	if err := auditchain.CheckReceiptResult(a, []byte("{\n  \"echo\": \"hi\"\n}\n")); err != nil {
		t.Fatalf("its result: %v", err)
	}
	if err := auditchain.CheckReceiptProof(a, pa, pub); err != nil {
		t.Fatalf("its proof: %v", err)
	}

	// One byte changed, anywhere in what is signed.
	for _, change := range []func(r *api.Receipt){
		func(r *api.Receipt) { r.ResultSHA256 = otherFirst(r.ResultSHA256) },
		func(r *api.Receipt) { r.Agent = "agent-2" },
		func(r *api.Receipt) { r.PolicyRevision = 8 },
		func(r *api.Receipt) {
			s, _ := base64.StdEncoding.DecodeString(r.Sig)
			s[0] ^= 1
			r.Sig = base64.StdEncoding.EncodeToString(s)
		},
	} {
		c := *a
		change(&c)
		if got := ecodeOf(auditchain.CheckReceipt(&c, pub)); got != api.EReceiptForged {
			t.Errorf("a changed receipt: %q, want %s", got, api.EReceiptForged)
		}
	}
	// Another key.
	_, other, _ := ed25519.GenerateKey(nil)
	if got := ecodeOf(auditchain.CheckReceipt(a, other.Public().(ed25519.PublicKey))); got != api.EReceiptForged {
		t.Errorf("another key: %q", got)
	}
	if got := ecodeOf(auditchain.CheckReceiptResult(a, []byte(`{"echo":"other"}`))); got != api.EReceiptResult {
		t.Errorf("another result: %q, want %s", got, api.EReceiptResult)
	}
	// Another event's proof, valid in itself.
	if got := ecodeOf(auditchain.CheckReceiptProof(a, pb, pub)); got != api.EReceiptProof {
		t.Errorf("another event's proof: %q, want %s", got, api.EReceiptProof)
	}
	// The checkpoint changed (its signature then fails), or the path: a
	// proof for another tree.
	cp := *pa.Checkpoint
	cp.Root = fmt.Sprintf("%064x", 1)
	bad := *pa
	bad.Checkpoint = &cp
	if got := ecodeOf(auditchain.CheckReceiptProof(a, &bad, pub)); got != api.EReceiptHeadForged {
		t.Errorf("another root: %q, want %s", got, api.EReceiptHeadForged)
	}
	bad = *pa
	bad.Path = append([]string{}, pa.Path...)
	if len(bad.Path) == 0 {
		t.Fatal("no path to change")
	}
	bad.Path[0] = fmt.Sprintf("%064x", 2)
	if got := ecodeOf(auditchain.CheckReceiptProof(a, &bad, pub)); got != api.EReceiptTree {
		t.Errorf("another path: %q, want %s", got, api.EReceiptTree)
	}
	// The event proven carries another receipt than the one shown (a
	// receipt re-signed for another result, with the right event id).
	forged := *a
	forged.ResultSHA256 = auditchain.Digest([]byte(`{"echo":"forged"}`))
	auditchain.NewReceiptSigner(tr.key).Sign(&forged)
	if got := ecodeOf(auditchain.CheckReceiptProof(&forged, pa, pub)); got != api.EReceiptProof {
		t.Errorf("another receipt for the event: %q, want %s", got, api.EReceiptProof)
	}
}

// TestReceiptProofWithTheHeadAlone: a v3 checkpoint's signature covers its
// head (the root, the link and a hash of the listing), so the proof a
// caller is given holds the head alone, names no other event, and checks
// offline. A proof for another tree, a changed byte of the head, and a
// listing that is not the one its hash names are each refused with their
// code; a v2 checkpoint, whose signature covers its listing, has no head
// and still checks whole.
func TestReceiptProofWithTheHeadAlone(t *testing.T) {
	tr := newTrail(t)
	pub := tr.key.Public().(ed25519.PublicKey)
	// As on an authenticated bus: audit's events carry its MAC, and its
	// checkpoints say so (version 3).
	p := tr.auditProcess()
	c := p.attested("w")
	emit := func(id, result string) *api.Receipt {
		r, subject, data := tr.receiptData(id, json.RawMessage(result))
		if _, err := p.js.Publish(tr.ctx, subject, data); err != nil {
			t.Fatal(err)
		}
		return r
	}
	step := func(from int) {
		for i := from; i < from+5; i++ {
			p.publish([]string{"globex", "initech"}[i%2], i, false)
		}
		stepAll(t, tr, c)
	}
	stepAll(t, tr, c) // nothing yet: it starts taking leaves
	a := emit("inv-a", `{"echo":"hi"}`)
	b := emit("inv-b", `{"echo":"other"}`)
	step(0)
	emit("inv-c", `{"echo":"later"}`)
	step(5)
	pa, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, a.EventID, pub)
	if err != nil {
		t.Fatal(err)
	}
	if pa.Checkpoint.V != auditchain.Version || pa.Checkpoint.Listing == "" {
		t.Fatalf("checkpoint version %d, listing %q", pa.Checkpoint.V, pa.Checkpoint.Listing)
	}
	pc, err := auditchain.Prove(tr.ctx, auditchain.Bus{JS: tr.js}, "inv-c:tool.succeeded", pub)
	if err != nil {
		t.Fatal(err)
	}
	// What the caller of inv-a is given, as it travels.
	agent := *pa
	agent.Checkpoint = pa.Checkpoint.Head()
	wire, err := json.Marshal(&agent)
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{b.EventID, "inv-b", `"ids"`, `"tenants"`, `"leaves"`} {
		if strings.Contains(string(wire), other) {
			t.Fatalf("the head's proof shows %s: %s", other, wire)
		}
	}
	var got auditchain.Proof
	if err := json.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	if err := auditchain.CheckReceiptProof(a, &got, pub); err != nil {
		t.Fatalf("the head's proof: %v", err)
	}
	// Its head links as the whole checkpoint does.
	if got.Checkpoint.Hash() != pa.Checkpoint.Hash() {
		t.Errorf("the head's hash %s, the checkpoint's %s", got.Checkpoint.Hash(), pa.Checkpoint.Hash())
	}

	refused := func(name string, p *auditchain.Proof, want string) {
		t.Helper()
		if got := ecodeOf(auditchain.CheckReceiptProof(a, p, pub)); got != want {
			t.Errorf("%s: %q, want %s", name, got, want)
		}
	}
	// A proof for another tree: inv-a's leaf and path under the head of
	// the next checkpoint, or the path of another size.
	other := got
	other.Checkpoint = pc.Checkpoint.Head()
	refused("another tree's head", &other, api.EReceiptTree)
	other = got
	other.Path = other.Path[1:]
	refused("a path cut short", &other, api.EReceiptTree)
	// One byte of the head changed, each member that is signed.
	for _, change := range []func(c *auditchain.Checkpoint){
		func(c *auditchain.Checkpoint) { c.Listing = otherFirst(c.Listing) },
		func(c *auditchain.Checkpoint) { c.Prev = strings.Repeat("0", 64) },
		func(c *auditchain.Checkpoint) { c.Writer += "x" },
		func(c *auditchain.Checkpoint) { c.Foreign = []uint64{c.Last} },
		func(c *auditchain.Checkpoint) { c.Time = "2000" + c.Time[4:] },
	} {
		h := *got.Checkpoint
		change(&h)
		changed := got
		changed.Checkpoint = &h
		refused("a changed head", &changed, api.EReceiptHeadForged)
	}
	// The listing beside the head, changed: a tenant renamed, an id.
	for _, change := range []func(c *auditchain.Checkpoint){
		func(c *auditchain.Checkpoint) { c.Tenants = append([]string{"globex"}, c.Tenants[1:]...) },
		func(c *auditchain.Checkpoint) { c.IDs = append([]string{"inv-x:tool.succeeded"}, c.IDs[1:]...) },
	} {
		l := *pa.Checkpoint
		change(&l)
		listed := *pa
		listed.Checkpoint = &l
		refused("a listing that is not its hash's", &listed, api.EReceiptListing)
		if err := l.Check(pub); !errors.Is(err, auditchain.ErrListing) {
			t.Errorf("the checkpoint with that listing: %v, want ErrListing", err)
		}
	}
	// A head is not a checkpoint to verify the trail with.
	if err := got.Checkpoint.Check(pub); !errors.Is(err, auditchain.ErrMalformed) {
		t.Errorf("a head checked whole: %v, want ErrMalformed", err)
	}

	// A v3 chain verifies end to end offline; a listing changed in the
	// copy is named as the checkpoint's forgery.
	exp := tr.export(auditchain.ExportOptions{})
	if r := verifyFile(t, exp, pub); !r.Intact() {
		t.Fatalf("the v3 chain offline: %+v", r.Findings)
	}
	var changed []byte
	done := false
	for _, line := range bytes.SplitAfter(exp, []byte("\n")) {
		var l map[string]json.RawMessage
		if json.Unmarshal(line, &l) == nil && string(l["kind"]) == `"checkpoint"` && !done {
			var data []byte
			var cp auditchain.Checkpoint
			if json.Unmarshal(l["data"], &data) != nil || json.Unmarshal(data, &cp) != nil {
				t.Fatalf("a checkpoint line: %s", line)
			}
			cp.Tenants[0] = "globex"
			data, _ = json.Marshal(&cp)
			l["data"], _ = json.Marshal(data)
			line, _ = json.Marshal(l)
			line, done = append(line, '\n'), true
		}
		changed = append(changed, line...)
	}
	r := verifyFile(t, changed, pub)
	if r.Intact() || !strings.Contains(fmt.Sprint(r.Findings), auditchain.ErrListing.Error()) {
		t.Fatalf("a changed listing offline: %+v", r.Findings)
	}

	// Version 2: the listing is signed itself, so there is no head; the
	// whole checkpoint proves as before.
	v2 := *pa.Checkpoint
	v2.V, v2.Listing = auditchain.VersionListed, ""
	v2.Sign(tr.key)
	if v2.Listing != "" || v2.Head() != nil {
		t.Fatalf("a v2 checkpoint with a listing hash %q or a head", v2.Listing)
	}
	old := *pa
	old.Checkpoint = &v2
	if err := auditchain.CheckReceiptProof(a, &old, pub); err != nil {
		t.Fatalf("a v2 checkpoint's proof: %v", err)
	}
	v2.IDs = append([]string{"inv-x:tool.succeeded"}, v2.IDs[1:]...)
	refused("a v2 checkpoint changed", &old, api.EReceiptHeadForged)
}

// TestDigestIsOfTheCompactJSON: the digest is SHA-256 of json.Compact's
// output whether the value comes compact (hashed without a copy) or not,
// whitespace inside strings and escaped quotes kept; what is not JSON is
// hashed as it is.
func TestDigestIsOfTheCompactJSON(t *testing.T) {
	for _, raw := range []string{
		`{"message":"hello world"}`, "{\"message\": \"hello world\"}", "{\n  \"a\": [1, 2,\t3]\r\n}",
		`{"q":"a \" b","n":null}`, `{"q":"a \\"}`, `"  spaced  "`, `[ ]`, `not json`, `{"open": "x`, `{"esc":"\\\" }"}`,
	} {
		var c bytes.Buffer
		want := []byte(raw)
		if json.Compact(&c, want) == nil {
			want = c.Bytes()
		}
		h := sha256.Sum256(want)
		if got := auditchain.Digest([]byte(raw)); got != hex.EncodeToString(h[:]) {
			t.Errorf("Digest(%q) = %s, want the SHA-256 of %q", raw, got, want)
		}
	}
}

// otherFirst returns hex with its first digit changed: "0" in front would
// change nothing when the digit is already 0 (one hash in sixteen).
func otherFirst(hex string) string {
	if hex[0] == '0' {
		return "1" + hex[1:]
	}
	return "0" + hex[1:]
}

// TestSealResultEncodesAsMarshal: the receipt SealResult puts in the
// message, encoded once for its signature and its member, is json.Marshal
// of the receipt, as every build wrote it, whatever its fields hold.
func TestSealResultEncodesAsMarshal(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	s := auditchain.NewReceiptSigner(key)
	msg := []byte(`{"data":{"status":"success"},"tenantid":"acme"}`)
	end := bytes.IndexByte(msg, '}')
	for _, r := range []api.Receipt{
		{InvocationID: "i", Tenant: "acme", Status: api.StatusSuccess, EventID: "i:tool.succeeded", IssuedAt: "2026-01-01T00:00:00Z"},
		{InvocationID: "i<&>\u2028é\"", Tenant: "a\\b", Agent: "did:<x>", ToolID: "t", ToolVersion: "1", ManifestDigest: "m",
			ParamsSHA256: "p", PolicyRevision: 9, Decision: "allow", Approvers: []string{"ann", "<bob>"},
			Approval:  &api.DecisionProof{Subject: "s", Headers: map[string][]string{"Z": {"1"}, "A": {"<2>", "3"}}, Body: []byte("x\x00y")},
			Documents: []api.DocumentPin{{Source: "s", DocumentID: "d", Version: "2"}}, Status: api.StatusError, ErrorCode: "E1",
			ResultSHA256: "r", EventID: "e", ReceivedAt: "then", IssuedAt: "now"},
	} {
		got := sealsAsMarshal(t, s, &r, msg, end)
		if opened, err := auditchain.OpenResult(got, s.Public()); err != nil || opened.Sig != r.Sig {
			t.Fatalf("does not open: %v", err)
		}
	}
}

// sealResultBudget is SealResult's allocations per call, recorded: the
// digest's, the signature's and the message's, the receipt encoded once
// and carried into the message without a copy between.
var sealResultBudget = map[string]float64{"seal result": 5}

func TestSealResultAllocations(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	s := auditchain.NewReceiptSigner(key)
	msg := []byte(`{"data":{"status":"success"},"tenantid":"acme"}`)
	end := bytes.IndexByte(msg, '}')
	r := api.Receipt{InvocationID: "i", Tenant: "acme", Status: api.StatusSuccess, EventID: "i:tool.succeeded", IssuedAt: "2026-01-01T00:00:00Z"}
	allocbudget.Check(t, sealResultBudget, map[string]func(){"seal result": func() {
		if _, err := s.SealResult(&r, msg, end); err != nil {
			t.Fatal(err)
		}
	}})
}

// FuzzReceiptEncodesAsMarshal: whatever its strings and bytes hold, the
// receipt SealResult signs and carries is json.Marshal's.
func FuzzReceiptEncodesAsMarshal(f *testing.F) {
	f.Add("i<&>\u2028é\"", "a\\b", "did:\xff<x>", "\u2029\x00\x7f", []byte("x\x00y"), uint64(9))
	f.Add("i", "acme", "", "", []byte(nil), uint64(0))
	_, key, _ := ed25519.GenerateKey(nil)
	s := auditchain.NewReceiptSigner(key)
	msg := []byte(`{"data":{"status":"success"},"tenantid":"acme"}`)
	end := bytes.IndexByte(msg, '}')
	f.Fuzz(func(t *testing.T, id, tenant, agent, other string, body []byte, rev uint64) {
		r := api.Receipt{InvocationID: id, Tenant: tenant, Agent: agent, ToolID: other, ToolVersion: agent + other,
			PolicyRevision: rev, Decision: other, Approvers: []string{agent, other},
			Approval:  &api.DecisionProof{Subject: other, Headers: map[string][]string{other: {agent}, agent: {id}}, Body: body},
			Documents: []api.DocumentPin{{Source: other, DocumentID: id, Version: tenant}}, Status: api.Status(other),
			ErrorCode: other, ResultSHA256: id, EventID: id + other, ReceivedAt: agent, IssuedAt: tenant}
		sealsAsMarshal(t, s, &r, msg, end)
	})
}

// sealsAsMarshal is the message SealResult makes of r, failing t unless
// it is the one json.Marshal's receipt makes (CarryReceipt).
func sealsAsMarshal(t *testing.T, s *auditchain.ReceiptSigner, r *api.Receipt, msg []byte, end int) []byte {
	t.Helper()
	got, err := s.SealResult(r, msg, end)
	if err != nil {
		t.Fatal(err)
	}
	want, err := auditchain.CarryReceipt(msg, end, r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("sealed\n%q\nmarshalled\n%q", got, want)
	}
	return got
}
