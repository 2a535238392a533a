package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/subjects"
)

// TestAuditChainNamesForeignEvents: events published on audit.demo.… by a
// process that is not an audit process (audit's bus credentials leaked to a
// host without the chain key: no other credential may publish there), a
// copy of a real event with its headers and new bytes, are
// covered by the next checkpoint as events no audit process wrote:
// `audit verify` names each by sequence and event id and is not intact, on
// the bus and from an export; audit's own events are not named.
func TestAuditChainNamesForeignEvents(t *testing.T) {
	s := serveEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	// The forger: audit's credentials, without the chain key.
	fjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleAudit)))
	pub, err := busauth.LoadAuditChainPublicKey(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 1, "demo")
	ac, _ := client.New(nc)
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"original"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	subject := subjects.AuditEvent("demo", "tool.succeeded")
	var orig *jetstream.RawStreamMsg
	eventually(t, 20*time.Second, "the call's terminal audit event", func() bool {
		audit, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return false
		}
		m, err := audit.GetLastMsgForSubject(ctx, subject)
		if err != nil || !strings.Contains(string(m.Data), id) {
			return false
		}
		orig = m
		return true
	})
	origID := id + ":tool.succeeded"
	if !bytes.Contains(orig.Data, []byte(origID)) {
		t.Fatalf("the terminal event is not %s: %s", origID, orig.Data)
	}

	// The copy keeps every header but the message id (which the stream
	// would deduplicate); the new event is made up.
	h := nats.Header{}
	for k, v := range orig.Header {
		if k != jetstream.MsgIDHeader && !strings.HasPrefix(k, "Nats-") {
			h[k] = v
		}
	}
	copied, err := fjs.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: orig.Data})
	if err != nil {
		t.Fatalf("publishing a copy with audit's credentials: %v", err)
	}
	forgedID := "inv-forged:tool.succeeded"
	forged := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"urn:toolgate:audit","type":"ai.agent.tool.succeeded","subject":"inv-forged","datacontenttype":"application/json","time":%q,"data":{"invocation_id":"inv-forged","tenant_id":"demo","tool_id":"echo"}}`,
		forgedID, time.Now().UTC().Format(time.RFC3339Nano))
	made, err := fjs.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: nats.Header{"Content-Type": {"application/cloudevents+json"}},
		Data: []byte(forged)})
	if err != nil {
		t.Fatalf("publishing a new event with audit's credentials: %v", err)
	}
	last := max(copied.Sequence, made.Sequence)
	eventually(t, 30*time.Second, fmt.Sprintf("a checkpoint to cover AUDIT up to %d", last), func() bool {
		tail, err := auditchain.LastCheckpoint(ctx, ojs)
		return err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= last
	})
	want := map[uint64]string{copied.Sequence: origID, made.Sequence: forgedID}

	r, err := auditchain.Verify(ctx, auditchain.Bus{JS: ojs}, auditchain.Options{Key: pub, To: last})
	if err != nil {
		t.Fatal(err)
	}
	namesForeign(t, "on the bus", r, want)

	var buf bytes.Buffer
	if _, err := auditchain.Export(ctx, auditchain.Bus{JS: ojs}, &buf, auditchain.ExportOptions{To: last}); err != nil {
		t.Fatal(err)
	}
	f, err := auditchain.ReadFile(&buf)
	if err != nil {
		t.Fatal(err)
	}
	r, err = auditchain.Verify(ctx, f, auditchain.Options{Key: pub})
	if err != nil {
		t.Fatal(err)
	}
	namesForeign(t, "offline", r, want)
}

// namesForeign checks that r names exactly the events of want (sequence to
// event id) as written by no audit process, and nothing else.
func namesForeign(t *testing.T, where string, r *auditchain.Report, want map[uint64]string) {
	t.Helper()
	if r.Intact() {
		t.Errorf("%s: verify says intact with %d foreign events in the trail", where, len(want))
	}
	got := map[uint64]string{}
	for _, f := range r.Findings {
		if f.Kind != auditchain.KindForeign {
			t.Errorf("%s: unexpected finding %s", where, f)
			continue
		}
		got[f.Seq] = f.EventID
	}
	for seq, id := range want {
		if got[seq] != id {
			t.Errorf("%s: seq %d (event %s) not named as written by no audit process; findings %v", where, seq, id, r.Findings)
		}
	}
	for seq, id := range got {
		if _, ok := want[seq]; !ok {
			t.Errorf("%s: audit's own event %s at seq %d named foreign", where, id, seq)
		}
	}
}
