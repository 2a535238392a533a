package busauth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/cputime"
)

// tenantVerifier reads "<tenant>:<jti>" tokens: the token's own check is
// BenchmarkHandle's; this measures what the tenant's account adds.
type tenantVerifier struct{}

func (tenantVerifier) VerifyConnectToken(_ context.Context, raw string) (AgentToken, error) {
	tenant, jti, ok := strings.Cut(raw, ":")
	if !ok {
		return AgentToken{}, errors.Join(ErrBadToken, errors.New("not tenant:jti"))
	}
	return AgentToken{Tenant: tenant, Subject: "did:bench", ID: jti, Expires: time.Now().Add(time.Hour)}, nil
}

// BenchmarkTenantConnect is an agent's CONNECT to the embedded server
// (in-process authentication), over TCP, until the server has admitted it:
// "first" is each tenant's first connection, which makes the tenant's
// account and its imports; "later" another connection of a tenant whose
// account exists; "account" the making of an account alone.
func BenchmarkTenantConnect(b *testing.B) {
	dir := b.TempDir()
	k, err := WriteCredentials(dir)
	if err != nil {
		b.Fatal(err)
	}
	ip, err := NewInProcess(CalloutConfig{Keys: k, Verifier: tenantVerifier{}})
	if err != nil {
		b.Fatal(err)
	}
	o, err := EmbeddedOptions(k, ServerSettings{Name: "bench", Port: -1, StoreDir: dir, InProcess: ip})
	if err != nil {
		b.Fatal(err)
	}
	o.NoLog = true
	s, err := server.NewServer(o)
	if err != nil {
		b.Fatal(err)
	}
	ip.Bind(s)
	s.Start()
	b.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(5 * time.Second) {
		b.Fatal("server not ready")
	}
	connect := func(tenant string, i int) {
		nc, err := nats.Connect(s.ClientURL(), nats.Token(fmt.Sprintf("%s:tok-%d", tenant, i)), nats.NoReconnect())
		if err != nil {
			b.Fatal(err)
		}
		nc.Close()
	}
	n := 0
	b.Run("first", func(b *testing.B) {
		cpuPerOp(b, func() {
			n++
			connect(fmt.Sprintf("first%d", n), n)
		})
	})
	b.Run("later", func(b *testing.B) {
		connect("warm", 0)
		cpuPerOp(b, func() {
			n++
			connect("warm", n)
		})
	})
	b.Run("account", func(b *testing.B) {
		cpuPerOp(b, func() {
			n++
			if _, err := ip.tenants.get(s, fmt.Sprintf("acct%d", n)); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// cpuPerOp runs op in b's loop and reports the process's CPU time per op
// (client and server alike), the figure a shared machine does not move.
func cpuPerOp(b *testing.B, op func()) {
	before := cputime.Process()
	for b.Loop() {
		op()
	}
	cpu := (cputime.Process() - before) / time.Duration(b.N)
	b.ReportMetric(float64(cpu.Microseconds()), "cpu-µs/op")
}
