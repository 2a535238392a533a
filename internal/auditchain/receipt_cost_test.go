package auditchain_test

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/audit"
	"github.com/toolgate/toolgate/subjects"
)

// TestReceiptShare measures, as TestAuditChainShare does, the audit
// stage's CPU per call in one process with the embedded server (its
// runner ending N calls, each now with a signed receipt), and apart the
// receipt's own work per call: the two hashes, the signature, and the
// receipt's encoding in the terminal event, the result and the status
// record. docs/audit.md reports the share against the goal of 5 %.
func TestReceiptShare(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	tr := newTrail(t)
	const n = 3000
	pad := strings.Repeat("x", 450)
	params := json.RawMessage(`{"message":"` + pad[:100] + `"}`)
	result := json.RawMessage(`{"echo":"` + pad + `"}`)
	tr.handToAudit(n, func(inv *envelope.Invocation) {
		inv.Request.Parameters, inv.Request.AgentContext = params, api.AgentContext{AgentDID: "did:agent:a"}
		inv.ReceivedAt = time.Now()
		inv.Authz = &envelope.Authorization{PolicyRevision: 3, ManifestDigest: auditchain.Digest([]byte(`{"id":"echo"}`))}
		inv.Succeed(subjects.Verify, result)
	})
	store, err := kvstore.Open(tr.ctx, tr.js, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := audit.New(store, nil)
	signer := auditchain.NewReceiptSigner(tr.key)
	a.SignReceipts(signer)
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	auditCPU, auditWall := tr.runAudit(a, tr.js, store, n)
	// A receipt as the stage made it, from the last call's status.
	rec, err := store.Status(tr.ctx, "acme", fmt.Sprintf("inv-%06d", n-1))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Response == nil || rec.Response.Receipt == nil {
		t.Fatal("the call ended without a receipt")
	}
	made := *rec.Response.Receipt
	if err := auditchain.CheckReceipt(&made, signer.Public()); err != nil {
		t.Fatal(err)
	}

	// The receipt's own work per call, on a receipt of that size, in
	// CPU as audit's is (on a loaded machine a benchmark's wall time is
	// mostly waiting for a core).
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	rcpu0 := processCPU()
	for range n {
		r := made
		r.ParamsSHA256, r.ResultSHA256 = auditchain.Digest(params), auditchain.Digest(result)
		signer.Sign(&r)
		for range 3 { // the event, the result, the status record
			if _, err := json.Marshal(&r); err != nil {
				t.Fatal(err)
			}
		}
	}
	receiptCPU := processCPU() - rcpu0
	runtime.ReadMemStats(&m1)
	auditUS := float64(auditCPU.Nanoseconds()) / 1e3 / n
	receiptUS := float64(receiptCPU.Nanoseconds()) / 1e3 / n
	body, _ := json.Marshal(made)
	t.Logf("audit stage with receipts: %d calls, %v CPU in %v: %.1f µs per call", n, auditCPU, auditWall, auditUS)
	t.Logf("receipt (%d bytes): hashes, signature and three encodings %.1f µs (%d allocs) per call: %.2f %% of audit's",
		len(body), receiptUS, (m1.Mallocs-m0.Mallocs)/n, 100*receiptUS/auditUS)
}
