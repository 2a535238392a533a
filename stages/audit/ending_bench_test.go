package audit

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// BenchmarkEnding is audit's ending of one call with a receipt, its
// outputs signed as a chained audit's connection signs them (its events
// left to the chain): the stage's work without the bus, where the
// signatures an ending costs show.
func BenchmarkEnding(b *testing.B) {
	_, chainKey, _ := ed25519.GenerateKey(rand.Reader)
	_, hopKey, _ := ed25519.GenerateKey(rand.Reader)
	a := &Auditor{store: plainStore{}}
	a.SignReceipts(auditchain.NewReceiptSigner(chainKey))
	signer := seal.NewSigner(busauth.RoleAudit, hopKey)
	pad := strings.Repeat("x", 450)
	params := json.RawMessage(`{"message":"` + pad[:100] + `"}`)
	result := json.RawMessage(`{"echo":"` + pad + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusPending,
			Request: &api.Request{ToolID: "echo", Parameters: params, AgentContext: api.AgentContext{AgentDID: "did:agent:a"}}}
		inv.Succeed(subjects.Verify, result)
		outs, err := a.Process(context.Background(), inv)
		if err != nil || len(outs) != 2 {
			b.Fatalf("%d outputs, %v", len(outs), err)
		}
		for _, o := range outs {
			if !subjects.IsAudit(o.Subject) {
				signer.Sign(o.Subject, o.Header, o.Data)
			}
		}
	}
}
