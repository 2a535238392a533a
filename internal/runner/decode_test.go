package runner

import (
	"crypto/ed25519"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/subjects"
)

// TestOwnHandoffsSkipTheScan: a hand-off this process signed is decoded
// without encoding/json's validity scan (it encoded the bytes itself); one
// signed elsewhere, or read a second time, is scanned as before, and all
// decode to the same invocation.
func TestOwnHandoffsSkipTheScan(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	msgs := seal.NewMessages(map[busauth.Role]ed25519.PublicKey{busauth.RoleRoute: pub})
	var own int
	decodeOwn = func(b []byte) (*envelope.Invocation, error) { own++; return envelope.DecodeOwn(b) }
	t.Cleanup(func() { decodeOwn = envelope.DecodeOwn })
	r := &Runner{Name: subjects.Execute, Stage: passStage{}, Senders: func(subject string, h nats.Header, data []byte) (bool, error) {
		_, ours, err := msgs.Check(subject, h, data)
		return ours, err
	}}
	inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Status: api.StatusPending,
		Request: &api.Request{ToolID: "noop", Parameters: []byte(`{"a":[1,"x"]}`)}}
	o, err := Handoff(inv, subjects.Execute)
	if err != nil {
		t.Fatal(err)
	}
	local := msgs.NewSigner(busauth.RoleRoute, priv)
	h := local.Sign(o.Subject, o.Header, o.Data)
	for i, c := range []struct {
		name string
		h    nats.Header
		own  int
	}{
		{"signed by this process", h, 1},
		{"the same message read again", h, 0},
		{"signed by another process", seal.NewSigner(busauth.RoleRoute, priv).Sign(o.Subject, o.Header, o.Data), 0},
	} {
		own = 0
		got, err := r.decode(o.Subject, c.h, o.Data, uint64(i+1))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if own != c.own {
			t.Errorf("%s: decoded without the scan %d times, want %d", c.name, own, c.own)
		}
		if got.ID != inv.ID || got.Request == nil || string(got.Request.Parameters) != `{"a":[1,"x"]}` {
			t.Errorf("%s: decoded %+v", c.name, got)
		}
	}
}
