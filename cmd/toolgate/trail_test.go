package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// TestAuditVerifyNamesForeignEvents: an event published on audit.demo.…
// by a process that is not an audit process (audit's bus credentials on a
// host without the chain key; no other credential may publish there) is
// named by `audit verify`, on the bus
// and offline from an export, by sequence and event id, and the exit
// status says the trail is not intact.
func TestAuditVerifyNamesForeignEvents(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	if r := tg(t, "", s.flags("invoke", "echo", "--params", `{"message":"audited"}`, "--wait")...); r.code != exitOK {
		t.Fatalf("invoke: %+v", r)
	}
	nc, err := nats.Connect(s.url, busauth.CredentialsOption(node.CredsPath(s.data, busauth.RoleAudit)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id := "inv-forged-cli:tool.succeeded"
	ack, err := js.Publish(ctx, subjects.AuditEvent("demo", "tool.succeeded"),
		fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"source":"urn:toolgate:audit","type":"ai.agent.tool.succeeded","data":{}}`, id))
	if err != nil {
		t.Fatalf("publishing on audit.demo with audit's credentials: %v", err)
	}
	for {
		tail, err := auditchain.LastCheckpoint(ctx, js)
		if err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= ack.Sequence {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no checkpoint covers seq %d", ack.Sequence)
		}
		time.Sleep(100 * time.Millisecond)
	}
	line := fmt.Sprintf("foreign seq %d event %s", ack.Sequence, id)
	r := tg(t, "", s.flags("audit", "verify")...)
	if r.code != exitError || !strings.Contains(r.stdout, line) {
		t.Fatalf("audit verify: exit %d, want %d naming %q:\n%s%s", r.code, exitError, line, r.stdout, r.stderr)
	}
	r = tg(t, "", s.flags("audit", "export", "--all", "--chain")...)
	if r.code != exitOK {
		t.Fatalf("audit export: %+v", r)
	}
	file := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(file, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	r = tg(t, "", "audit", "verify", "--file", file, "--key", filepath.Join(s.data, busauth.DirName, busauth.AuditChainPublicFile))
	if r.code != exitError || !strings.Contains(r.stdout, line) {
		t.Fatalf("audit verify --file: exit %d, want %d naming %q:\n%s%s", r.code, exitError, line, r.stdout, r.stderr)
	}
}
