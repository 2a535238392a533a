package auditexport_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditexport"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestExport: events since a time, of one tenant or all, one JSON line each,
// oldest first; a second run writes the same lines.
func TestExport(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	pub := func(tenant string, i int) {
		ev := fmt.Sprintf("{\n  \"specversion\": \"1.0\", \"id\": \"%s-%d\", \"type\": \"ai.agent.tool.succeeded\"}", tenant, i)
		if _, err := js.Publish(ctx, subjects.AuditEvent(tenant, "tool.succeeded"), []byte(ev)); err != nil {
			t.Fatal(err)
		}
	}
	pub("acme", 0)
	pub("other", 0)
	time.Sleep(20 * time.Millisecond)
	since := time.Now()
	time.Sleep(20 * time.Millisecond)
	for i := 1; i <= 3; i++ {
		pub("acme", i)
		pub("other", i)
	}

	var all bytes.Buffer
	n, err := auditexport.Export(ctx, js, &all, auditexport.Options{})
	if err != nil || n != 8 {
		t.Fatalf("export all: %d events, %v; want 8", n, err)
	}
	var acme bytes.Buffer
	n, err = auditexport.Export(ctx, js, &acme, auditexport.Options{Since: since, Tenant: "acme"})
	if err != nil || n != 3 {
		t.Fatalf("export acme since: %d events, %v; want 3", n, err)
	}
	lines := strings.Split(strings.TrimSuffix(acme.String(), "\n"), "\n")
	for i, l := range lines {
		var e struct{ ID string }
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.ID != fmt.Sprintf("acme-%d", i+1) {
			t.Fatalf("line %d: %q (%v), want event acme-%d", i, l, err, i+1)
		}
	}
	var again bytes.Buffer
	if _, err := auditexport.Export(ctx, js, &again, auditexport.Options{Since: since, Tenant: "acme"}); err != nil || again.String() != acme.String() {
		t.Fatalf("second export differs: %q vs %q (%v)", again.String(), acme.String(), err)
	}
}
