package audit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// sealedEnding has an auditor with receipts end call id with result and
// returns its terminal event and result.
func sealedEnding(t *testing.T, a *Auditor, id string, result string) (stages.Output, stages.Output) {
	t.Helper()
	inv := &envelope.Invocation{ID: id, Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusPending,
		Request: &api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"hi"}`),
			AgentContext: api.AgentContext{AgentDID: "did:agent:a"}}}
	inv.Succeed(subjects.Verify, json.RawMessage(result))
	outs, err := a.Process(context.Background(), inv)
	if err != nil || len(outs) != 2 {
		t.Fatalf("%d outputs, %v", len(outs), err)
	}
	return outs[0], outs[1]
}

func ecode(err error) string {
	var te *api.Error
	if errors.As(err, &te) {
		return te.ECode
	}
	return ""
}

// TestResultSealedByItsReceipt: with receipts, audit's result carries no
// signature of its own: its receipt, signed once with the chain key, names
// the message's bytes, and the terminal event and status record carry the
// same receipt. A reader (seal.Messages) takes it as audit's; a byte of the
// result or of the receipt changed, another call's receipt, no receipt, or
// the seal on another subject or from another role are refused. A
// redelivery of the ending publishes the very same bytes, signing nothing.
func TestResultSealedByItsReceipt(t *testing.T) {
	chainPub, chainKey, _ := ed25519.GenerateKey(rand.Reader)
	_, auditKey, _ := ed25519.GenerateKey(rand.Reader)
	store := newFakeStore()
	a := &Auditor{store: store}
	a.SignReceipts(auditchain.NewReceiptSigner(chainKey))
	terminal, result := sealedEnding(t, a, "inv-1", `{"echo":"hi"}`)
	_, other := sealedEnding(t, a, "inv-2", `{"echo":"another"}`)

	if result.Header[seal.HeaderSeal][0] != seal.SealReceipt {
		t.Fatalf("the result is not sealed: %v", result.Header)
	}
	r, err := auditchain.OpenResult(result.Data, chainPub)
	if err != nil {
		t.Fatal(err)
	}
	if r.V != 2 || r.Ending == "" || r.InvocationID != "inv-1" || auditchain.CheckReceiptResult(r, json.RawMessage(`{"echo":"hi"}`)) != nil {
		t.Fatalf("receipt %+v", r)
	}
	var ev struct {
		Data struct {
			Receipt *api.Receipt `json:"receipt"`
		} `json:"data"`
	}
	if err := json.Unmarshal(terminal.Data, &ev); err != nil || ev.Data.Receipt == nil || ev.Data.Receipt.Sig != r.Sig {
		t.Fatalf("the terminal event carries another receipt: %s", terminal.Data)
	}
	if rec := store.records["inv-1"]; rec.Response == nil || rec.Response.Receipt == nil || rec.Response.Receipt.Sig != r.Sig {
		t.Fatalf("the status records another receipt: %+v", rec.Response)
	}

	// As published by audit's signing connection.
	signer := seal.NewSigner(busauth.RoleAudit, auditKey)
	h := signer.Sign(result.Subject, result.Header, result.Data)
	if h.Get(seal.HeaderSignature) != "" || h.Get(seal.HeaderSigner) != string(busauth.RoleAudit) {
		t.Fatalf("headers %v: want the signer and no signature of its own", h)
	}
	msgs := seal.NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleAudit: auditKey.Public().(ed25519.PublicKey)})
	msgs.TrustReceipts(chainPub)
	if role, err := msgs.Sender(result.Subject, h, result.Data); err != nil || role != busauth.RoleAudit {
		t.Fatalf("the sealed result: %v %v", role, err)
	}

	swap := func(data []byte, from, to string) []byte {
		t.Helper()
		if !bytes.Contains(data, []byte(from)) {
			t.Fatalf("%q not in %s", from, data)
		}
		return bytes.Replace(data, []byte(from), []byte(to), 1)
	}
	otherReceipt, err := auditchain.OpenResult(other.Data, chainPub)
	if err != nil {
		t.Fatal(err)
	}
	mine, _ := json.Marshal(r)
	theirs, _ := json.Marshal(otherReceipt)
	noSeal := nats.Header(maps.Clone(h))
	noSeal.Del(seal.HeaderSeal)
	for _, c := range []struct {
		name, subject string
		h             nats.Header
		data          []byte
		want          string
	}{
		{"a byte of the result changed", result.Subject, h, swap(result.Data, `"echo":"hi"`, `"echo":"ho"`), api.EReceiptEnding},
		{"a byte of the message's metadata changed", result.Subject, h, swap(result.Data, `"status":"success"`, `"status":"successs"`), api.EReceiptEnding},
		{"a byte of the receipt changed", result.Subject, h, swap(result.Data, string(mine), strings.Replace(string(mine), `"tool_id":"echo"`, `"tool_id":"ech0"`, 1)), api.EReceiptForged},
		{"another call's receipt", result.Subject, h, swap(result.Data, string(mine), string(theirs)), api.EReceiptEnding},
		{"no receipt", result.Subject, h, swap(result.Data, `,"receipt":`+string(mine), ""), api.EReceiptEnding},
		{"no seal and no signature", result.Subject, noSeal, result.Data, api.EMessageUnsigned},
		{"the seal on another call's subject", other.Subject, h, result.Data, api.EMessageUnsigned},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := msgs.Sender(c.subject, c.h, c.data); ecode(err) != c.want {
				t.Fatalf("%v, want %s", err, c.want)
			}
		})
	}
	t.Run("another role's seal", func(t *testing.T) {
		_, verifyKey, _ := ed25519.GenerateKey(rand.Reader)
		hv := seal.NewSigner(busauth.RoleVerify, verifyKey).Sign(result.Subject, result.Header, result.Data)
		m := seal.NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleVerify: verifyKey.Public().(ed25519.PublicKey)})
		m.TrustReceipts(chainPub)
		if _, err := m.Sender(result.Subject, hv, result.Data); ecode(err) != api.EMessageUnsigned {
			t.Fatalf("%v, want E3224", err)
		}
	})
	t.Run("a reader without the chain key", func(t *testing.T) {
		m := seal.NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleAudit: auditKey.Public().(ed25519.PublicKey)})
		if _, err := m.Sender(result.Subject, h, result.Data); ecode(err) != api.EMessageUnsigned {
			t.Fatalf("%v, want E3224", err)
		}
	})

	t.Run("a redelivery publishes the same bytes", func(t *testing.T) {
		time.Sleep(time.Millisecond)
		terminal2, result2 := sealedEnding(t, a, "inv-1", `{"echo":"hi"}`)
		if !bytes.Equal(result2.Data, result.Data) || result2.MsgID != result.MsgID || !bytes.Equal(terminal2.Data[bytes.Index(terminal2.Data, []byte(`"receipt"`)):], terminal.Data[bytes.Index(terminal.Data, []byte(`"receipt"`)):]) {
			t.Fatalf("the redelivered ending differs:\n%s\n%s", result2.Data, result.Data)
		}
	})
	t.Run("a receipt of version 1 still checks", func(t *testing.T) {
		v1 := &api.Receipt{V: 1, InvocationID: "old", Tenant: "acme", Status: api.StatusSuccess, EventID: "old:tool.succeeded",
			IssuedAt: "2026-11-01T00:00:00Z"}
		auditchain.NewReceiptSigner(chainKey).Sign(v1)
		if b, _ := json.Marshal(v1); strings.Contains(string(b), "ending") {
			t.Fatalf("a version 1 receipt names an ending: %s", b)
		}
		if err := auditchain.CheckReceipt(v1, chainPub); err != nil {
			t.Fatal(err)
		}
	})
}
