package auditchain_test

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/subjects"
)

// receiptEvent publishes the terminal event of invocation id carrying a
// receipt of result, signed with the trail's key, and returns the receipt.
func (tr *trail) receiptEvent(id string, result json.RawMessage) *api.Receipt {
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
	tr.publish(subjects.AuditEvent("acme", "tool.succeeded"), data)
	return r
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
		func(r *api.Receipt) { r.ResultSHA256 = "0" + r.ResultSHA256[1:] },
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
	// The proof of another tree: its root changed (its signature then
	// fails), or its path.
	cp := *pa.Checkpoint
	cp.Root = fmt.Sprintf("%064x", 1)
	bad := *pa
	bad.Checkpoint = &cp
	if got := ecodeOf(auditchain.CheckReceiptProof(a, &bad, pub)); got != api.EReceiptProof {
		t.Errorf("another tree: %q, want %s", got, api.EReceiptProof)
	}
	bad = *pa
	bad.Path = append([]string{}, pa.Path...)
	if len(bad.Path) == 0 {
		t.Fatal("no path to change")
	}
	bad.Path[0] = fmt.Sprintf("%064x", 2)
	if got := ecodeOf(auditchain.CheckReceiptProof(a, &bad, pub)); got != api.EReceiptProof {
		t.Errorf("another path: %q, want %s", got, api.EReceiptProof)
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
