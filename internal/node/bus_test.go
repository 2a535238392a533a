package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/auditarchive"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// served is a toolgate whose bus is authenticated: serve's embedded server,
// an external nats-server, or a cluster, with the pipeline running.
type served struct {
	urls    []string // client URLs of the server(s)
	dataDir string   // holds busauth/
	node    *node.Node
	// declared are the tenants the servers' configuration has accounts
	// for (external servers); nil: the embedded server, which makes a
	// tenant's account when its first agent connects.
	declared []string
	// chain counts the events audit's checkpoints covered, by where their
	// leaves came from.
	chain *prometheus.Registry
	// metrics is where toolgate serves its metrics; "": nowhere.
	metrics string
}

// chainCounted is a fresh count for a suite's audit checkpoints, and the
// stage configuration that keeps it.
func chainCounted() (*prometheus.Registry, node.StageConfig) {
	reg := prometheus.NewRegistry()
	return reg, node.StageConfig{AuditChainMetrics: node.NewAuditChainMetrics(reg)}
}

func (s *served) dial(i int, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(s.urls[i%len(s.urls)], append([]nats.Option{nats.NoReconnect(), nats.Timeout(3 * time.Second),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}, opts...)...)
}

// revoke revokes a token as the operator, through the control service
// (workers may not write revocations).
func (s *served) revoke(t *testing.T, jti string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := s.operator(t).RevokeToken(ctx, jti, time.Now().Add(time.Hour), "test", ""); err != nil {
		t.Fatal(err)
	}
}

// signer signs requests with role's credentials.
func (s *served) signer(t *testing.T, role busauth.Role) client.Sign {
	t.Helper()
	sg, err := busauth.SignerFromCreds(node.CredsPath(s.dataDir, role))
	if err != nil {
		t.Fatal(err)
	}
	return func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }
}

// operator is a client connected and signing with operator credentials.
func (s *served) operator(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	c.Sign = s.signer(t, busauth.RoleOperator)
	return c
}

func (s *served) connect(t *testing.T, i int, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := s.dial(i, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (s *served) creds(role busauth.Role) nats.Option {
	return busauth.CredentialsOption(node.CredsPath(s.dataDir, role))
}

// agentToken mints a capability token for tenant; change edits its claims.
func agentToken(t *testing.T, tenant string, change func(*token.Claims)) (string, *token.Claims) {
	t.Helper()
	c := token.Claims{ToolID: token.Patterns{"*"}, TenantID: tenant, AgentDID: "did:agent:" + tenant}
	c.ID = fmt.Sprintf("tok-%s-%d", tenant, time.Now().UnixNano())
	if change != nil {
		change(&c)
	}
	raw := mint(t, c)
	return raw, &c
}

func (s *served) agent(t *testing.T, i int, tenant string) (*nats.Conn, string) {
	t.Helper()
	raw, c := agentToken(t, tenant, nil)
	return s.connect(t, i, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix(tenant, c.ID))), raw
}

// runServed runs node.Run with cfg until the test ends and returns the node
// and the server's URL.
func runServed(t *testing.T, cfg node.Config) (*node.Node, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Examples = true
	cfg.Workers = 1
	cfg.Log = quietLog()
	cfg.Stage.Tokens = testVerifier()
	nodes := make(chan *node.Node, 1)
	var url string
	cfg.Ready = func(u string, n *node.Node) { url = u; nodes <- n }
	errc := make(chan error, 1)
	go func() { errc <- node.Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("node.Run: %v", err)
		}
	})
	select {
	case n := <-nodes:
		return n, url
	case err := <-errc:
		errc <- nil // for the cleanup
		t.Fatalf("toolgate did not start: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("toolgate did not start in time")
	}
	return nil, ""
}

// serveEmbedded is `toolgate serve`: the embedded server, always with auth.
// hopSigner is role's hop signer, with the key in s's data directory: what a
// host of that role signs with.
func (s *served) hopSigner(t *testing.T, role busauth.Role) *seal.Signer {
	t.Helper()
	k, err := busauth.LoadHopKey(s.dataDir, role)
	if err != nil {
		t.Fatal(err)
	}
	return seal.NewSigner(role, k)
}

// signedAs is a JetStream of role's credentials whose publishes role's own
// key signs (relayed where the role relays): what a host of that role can
// send.
func (s *served) signedAs(t *testing.T, role busauth.Role) jetstream.JetStream {
	t.Helper()
	js, _ := jetstream.New(s.connect(t, 0, s.creds(role)))
	return runner.Relaying(seal.SigningJetStream(js, s.hopSigner(t, role)))
}

func serveEmbedded(t *testing.T) *served {
	dir := t.TempDir()
	reg, stage := chainCounted()
	metrics := freeAddr(t)
	// As serve ships: the hand-offs in memory, the invocations kept until
	// they end.
	n, url := runServed(t, node.Config{Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir}, Stage: stage,
		MetricsAddr: metrics, Topology: topology.TopologyOptions{MemoryHops: true}})
	return &served{urls: []string{url}, dataDir: dir, node: n, chain: reg, metrics: metrics}
}

func TestServeNeverOpen(t *testing.T) {
	s := serveEmbedded(t)
	nc, err := s.dial(0)
	if err == nil {
		nc.Close()
		t.Fatal("an anonymous connection to serve's embedded server was admitted")
	}
	if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("anonymous connection: %v, want an authorization violation", err)
	}
}

func TestBusEmbedded(t *testing.T) {
	s := serveEmbedded(t)
	busSuite(t, s)
	t.Run("ended calls leave no invocation in the stream that keeps them", func(t *testing.T) { invocationsDeleted(t, s) })
	t.Run("refused publishes are audited", func(t *testing.T) { refusedPublishesAudited(t, s) })
	t.Run("an agent's client waits without a refusal", func(t *testing.T) { agentWaitsUnrefused(t, s) })
}

// invocationsDeleted: with the hand-offs in memory, the invoke stream keeps
// each invocation until its call ends, and audit deletes it then (its one
// right on that stream), so once the suite's calls ended none is left.
func invocationsDeleted(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	pipe, err := ojs.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	if got := pipe.CachedInfo().Config.Storage; got != jetstream.MemoryStorage {
		t.Fatalf("%s on %v storage, want memory", subjects.StreamPipeline, got)
	}
	invoke, err := ojs.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		t.Fatal(err)
	}
	info := invoke.CachedInfo()
	if info.Config.Retention != jetstream.LimitsPolicy || info.State.LastSeq == 0 {
		t.Fatalf("%s: %v retention, last sequence %d: want limits, and the suite's calls", subjects.StreamInvoke, info.Config.Retention, info.State.LastSeq)
	}
	// A call parked for a human's approval has not ended: its invocation
	// stays for a re-drive.
	store, err := kvstore.Open(ctx, ojs, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var ended []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		i, err := invoke.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ended = ended[:0]
		for seq := i.State.FirstSeq; seq <= i.State.LastSeq && i.State.Msgs > 0; seq++ {
			m, err := invoke.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			tenant := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
			rec, err := store.Status(ctx, tenant, m.Header.Get("ce-id"))
			if err != nil || rec.Status.Terminal() {
				ended = append(ended, fmt.Sprintf("%d %s %s: %s %v", seq, tenant, m.Header.Get("ce-id"), rec.Status, err))
			}
		}
		if len(ended) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds invocations of calls that ended: %q", subjects.StreamInvoke, ended)
		}
	}
	if i, err := invoke.Info(ctx); err != nil || i.State.Msgs >= i.State.LastSeq {
		t.Fatalf("none of the %s's invocations deleted: %+v, %v", subjects.StreamInvoke, i, err)
	}
}

// TestBusExternalServer runs a nats-server binary built from the module with
// the auth.conf toolgate writes, and toolgate against it with --auth-callout.
func TestBusExternalServer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("building nats-server: %v\n%s", err, out)
	}
	dir := filepath.Join(tmp, "data")
	if err := busauth.WriteTenants(dir, declaredTenants); err != nil {
		t.Fatal(err)
	}
	if _, err := busauth.WriteCredentials(dir); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\ninclude busauth/auth.conf\n",
		port, filepath.Join(tmp, "js"))), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(bin, "-c", conf)
	var log strings.Builder
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", log.String())
		}
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	eventually(t, 30*time.Second, "nats-server listening", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	reg, stage := chainCounted()
	n, _ := runServed(t, node.Config{NATSURL: url, AuthCallout: true, Embedded: node.EmbeddedOptions{DataDir: dir}, Stage: stage})
	busSuite(t, &served{urls: []string{url}, dataDir: dir, node: n, declared: declaredTenants, chain: reg})
}

// TestBusCluster runs three routed servers with the same configuration; the
// callout runs once, connected to the first; clients use every server.
func TestBusCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	dir := t.TempDir()
	if err := busauth.WriteTenants(dir, declaredTenants); err != nil {
		t.Fatal(err)
	}
	keys, err := busauth.WriteCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var urls []string
	for i := range 3 {
		o, err := busauth.EmbeddedOptions(keys, busauth.ServerSettings{Name: fmt.Sprintf("n%d", i), Port: -1,
			StoreDir: filepath.Join(dir, fmt.Sprintf("js%d", i)), Tenants: declaredTenants})
		if err != nil {
			t.Fatal(err)
		}
		o.NoLog = true
		o.Cluster.Name = "toolgate"
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port = ports[i]
		o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		srv, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		srv.Start()
		t.Cleanup(srv.Shutdown)
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("cluster server not ready")
		}
		urls = append(urls, srv.ClientURL())
	}
	reg, stage := chainCounted()
	n, _ := runServed(t, node.Config{NATSURL: urls[0], AuthCallout: true, Embedded: node.EmbeddedOptions{DataDir: dir},
		Topology: topology.TopologyOptions{Replicas: 3}, Stage: stage})
	busSuite(t, &served{urls: urls, dataDir: dir, node: n, declared: declaredTenants, chain: reg})
}

// declaredTenants are the tenants external servers have accounts for.
var declaredTenants = []string{"demo", "other"}

// busSuite is what every deployment must show: each role's allowed and
// refused operations, refused connections, and revocation closing a live
// connection.
func busSuite(t *testing.T, s *served) {
	t.Run("roles", func(t *testing.T) { busRoles(t, s) })
	t.Run("agent invokes and reads its result", func(t *testing.T) { agentRoundTrip(t, s) })
	t.Run("agent sends with the CloudEvents SDK", func(t *testing.T) { agentCloudEventsSDK(t, s) })
	t.Run("refused connections", func(t *testing.T) { busRefusals(t, s) })
	t.Run("revocation closes the connection", func(t *testing.T) { busRevoke(t, s) })
	t.Run("approvals record the signing operator", func(t *testing.T) { busApprovals(t, s) })
	t.Run("forged hops are refused at execute", func(t *testing.T) { forgedHops(t, s) })
	t.Run("only audit publishes audit events and results", func(t *testing.T) { onlyAuditPublishes(t, s) })
	t.Run("raw tokens reach validate and authorize only", func(t *testing.T) { tokensConfined(t, s) })
	t.Run("a hook decision written by another role starts nothing", func(t *testing.T) { forgedHookDecision(t, s) })
	t.Run("a leaked role credential owns nothing", func(t *testing.T) { leakedRoles(t, s) })
	t.Run("an agent cannot reach another tenant", func(t *testing.T) { crossTenant(t, s) })
	t.Run("the audit trail is checkpointed", func(t *testing.T) { auditCheckpointed(t, s) })
	t.Run("audit archives the trail", func(t *testing.T) { auditArchived(t, s) })
	t.Run("audit reads the trail for OTLP through its own consumer", func(t *testing.T) { auditOTLPConsumer(t, s) })
	t.Run("the audit trail survives its deletion", func(t *testing.T) { auditSurvives(t, s) })
	t.Run("a re-drive needs an operator's signed run", func(t *testing.T) { redriveSigned(t, s) })
	// Last: a promoted candidate stays live.
	t.Run("a shadow policy rules only once an operator signs it", func(t *testing.T) { shadowSigned(t, s) })
}

// tenant is name where the server makes a tenant's account as its first
// agent connects, else a declared tenant the other subtests do not use
// for what the caller counts.
func (s *served) tenant(name string) string {
	if s.declared == nil {
		return name
	}
	return s.declared[len(s.declared)-1]
}

// auditCheckpointed: the audit stage signs checkpoints over every event of
// the calls above with the deployment's audit chain key, and the trail
// verifies intact with its public half; no other role may write the
// chain.
func auditCheckpointed(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	pub, err := busauth.LoadAuditChainPublicKey(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	nc, raw := s.agent(t, 1, "demo")
	ac, _ := client.New(nc)
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"checkpointed"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	eventually(t, 20*time.Second, "the call's terminal audit event", func() bool {
		audit, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return false
		}
		m, err := audit.GetLastMsgForSubject(ctx, "audit.demo.tool.succeeded")
		if err != nil || !strings.Contains(string(m.Data), id) {
			return false
		}
		last = m.Sequence
		return true
	})
	eventually(t, 30*time.Second, fmt.Sprintf("a checkpoint to cover AUDIT up to %d", last), func() bool {
		tail, err := auditchain.LastCheckpoint(ctx, ojs)
		return err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= last
	})
	// A cluster may answer a read with no responders while a leader
	// moves: that is a retry, not a finding.
	var r *auditchain.Report
	eventually(t, 20*time.Second, "verify to read the trail", func() bool {
		r, err = auditchain.Verify(ctx, auditchain.Bus{JS: ojs}, auditchain.Options{Key: pub, To: last})
		if err != nil {
			t.Logf("verify: %v", err)
		}
		return err == nil
	})
	if !r.Intact() || r.CoveredLast < last || r.Events == 0 {
		t.Fatalf("verify: %+v", r)
	}
	// Every audit event is audit's to publish (the others relay theirs):
	// the checkpoints take their leaves from audit's publish acks, and
	// read back only the first second's (AUDIT was just made) and those
	// published before the checkpointer started.
	acks, read := chainEvents(t, s.chain, "ack"), chainEvents(t, s.chain, "read")
	t.Logf("%v events covered from publish acks, %v read back", acks, read)
	if acks == 0 || acks < read {
		t.Errorf("%v events covered from publish acks, %v read back: want most from the acks", acks, read)
	}
	for _, role := range append(slices.Clone(busauth.StageRoles), busauth.RoleControl) {
		if role == busauth.RoleAudit {
			continue
		}
		nc := s.connect(t, 0, s.creds(role))
		if got, err := refused(t, nc, false, subjects.AuditCheckpoint); err != nil || !got {
			t.Errorf("%s may publish a checkpoint (%v)", role, err)
		}
	}
}

// auditArchived: with its own credentials audit archives the closed
// ranges to the bus's archive bucket and reads each back (no consumer, no
// delete); the archive verifies across its objects; no other role may
// write the bucket.
func auditArchived(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pub, err := busauth.LoadAuditChainPublicKey(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	nc, raw := s.agent(t, 1, "demo")
	ac, _ := client.New(nc)
	if _, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"archived"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{}); err != nil {
		t.Fatal(err)
	}
	var last uint64
	eventually(t, 30*time.Second, "a checkpoint over the call", func() bool {
		audit, err := ojs.Stream(ctx, subjects.StreamAudit)
		if err != nil {
			return false
		}
		tail, err := auditchain.LastCheckpoint(ctx, ojs)
		last = audit.CachedInfo().State.LastSeq
		return err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= last
	})
	ajs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleAudit)))
	a := &auditarchive.Archiver{JS: ajs, Store: archivestore.NewNATS(ajs, subjects.BucketAuditArchive), Key: pub}
	got, err := a.Once(ctx)
	if err != nil || len(got) == 0 || got[len(got)-1].Last < last {
		t.Fatalf("audit archived %+v (%v), want up to seq %d", got, err, last)
	}
	rep, err := auditarchive.VerifyArchive(ctx, archivestore.NewNATS(ojs, subjects.BucketAuditArchive), pub)
	if err != nil || !rep.Intact() || rep.Events == 0 {
		t.Fatalf("the archive: %+v %v", rep, err)
	}
	for _, role := range append(slices.Clone(busauth.StageRoles), busauth.RoleControl) {
		if role == busauth.RoleAudit {
			continue
		}
		nc := s.connect(t, 0, s.creds(role))
		if got, err := refused(t, nc, false, subjects.ObjectChunks(subjects.BucketAuditArchive, "forged")); err != nil || !got {
			t.Errorf("%s may write the audit archive (%v)", role, err)
		}
	}
}

// auditOTLPConsumer: the SIEM export's consumer of AUDIT is made with the
// topology, and audit's credentials may pull and acknowledge through it
// (serve --audit-otlp); an agent's may not.
func auditOTLPConsumer(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ajs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleAudit)))
	in := subjects.AuditOTLPInput
	c, err := ajs.Consumer(ctx, in.Stream, in.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("audit pulls for OTLP: %v", err)
	}
	if !subjects.IsAudit(m.Subject()) {
		t.Fatalf("pulled %s", m.Subject())
	}
	if err := m.Nak(); err != nil {
		t.Fatal(err)
	}
	nc, _ := s.agent(t, 1, "demo")
	if got, err := refused(t, nc, false, "$JS.API.CONSUMER.MSG.NEXT."+in.Stream+"."+in.Consumer); err != nil || !got {
		t.Errorf("an agent may pull the OTLP consumer (%v)", err)
	}
}

// auditSurvives: an operator deletes AUDIT (only operators may); toolgate
// creates it again at once, records that it did, and calls keep flowing
// into it.
func auditSurvives(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if err := ojs.DeleteStream(ctx, subjects.StreamAudit); err != nil {
		t.Fatalf("operator deleting AUDIT: %v", err)
	}
	var st jetstream.Stream
	var last error
	defer func() {
		if t.Failed() {
			t.Logf("last lookup error: %v", last)
		}
	}()
	eventually(t, 20*time.Second, "AUDIT to be back with an audit.recreated event", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		defer ccancel()
		var err error
		if st, last = ojs.Stream(cctx, subjects.StreamAudit); last != nil {
			return false
		}
		m, err := st.GetLastMsgForSubject(cctx, subjects.AuditEvent(subjects.SystemTenant, "audit.recreated"))
		last = err
		// The deletion's advisory names it; the guard's ticker may find
		// the stream missing first.
		return err == nil && (strings.Contains(string(m.Data), `"noticed":"deleted"`) || strings.Contains(string(m.Data), `"noticed":"missing"`))
	})
	if cfg := st.CachedInfo().Config; !cfg.DenyDelete || !cfg.DenyPurge {
		t.Fatalf("recreated AUDIT allows deletes or purges: %+v", cfg)
	}
	nc, raw := s.agent(t, 1, "demo")
	ac, _ := client.New(nc)
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"after"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the next call's terminal audit event in the new AUDIT", func() bool {
		m, err := st.GetLastMsgForSubject(ctx, "audit.demo.tool.succeeded")
		return err == nil && strings.Contains(string(m.Data), id)
	})
}

// forgedHookDecision: execute's credentials may write invocation records,
// and so a hook decision naming a child with claims of its choosing; an
// agent then publishes that child. Authorize refuses it: audit did not
// sign the decision.
func forgedHookDecision(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	xjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleExecute)))
	xs, err := kvstore.Open(ctx, xjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleExecute].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	parent := fmt.Sprintf("forged-parent-%d", time.Now().UnixNano())
	link := &api.Link{Parent: parent, Root: parent, Hook: "h", Action: "retry", Depth: 1, Attempt: 1}
	child := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"as anyone"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, Link: link}
	claims, _ := json.Marshal(map[string]any{"tenant_id": "demo", "sub": "did:agent:root", "jti": "forged",
		"exp": time.Now().Add(time.Hour).Unix(), "capabilities": []map[string]any{{"tool_id": "*"}}})
	if _, err := xs.RecordHookDecision(ctx, kvstore.HookDecision{InvocationID: parent, Tenant: "demo", Seq: 1, Hook: "h",
		Action: "retry", Child: &kvstore.HookChild{ID: parent + ".hook1", Request: child, Claims: claims}}); err != nil {
		t.Fatalf("execute writing a hook decision: %v", err)
	}
	nc, _ := s.agent(t, 0, "demo")
	ac, _ := client.New(nc)
	id, err := ac.Invoke(ctx, child, client.InvokeOptions{ID: parent + ".hook1"})
	if err != nil {
		t.Fatal(err)
	}
	var rec api.Record
	eventually(t, 20*time.Second, "the linked call to end", func() bool {
		rec, err = ac.Status(ctx, "demo", id)
		return err == nil && rec.Status.Terminal()
	})
	if rec.Status != api.StatusPermissionDenied || rec.Error == nil || rec.Error.ECode != api.ERecordUnsigned {
		t.Fatalf("a child of a forged decision ended %s %+v, want permission_denied E3225", rec.Status, rec.Error)
	}
}

// tokensConfined: a parked call's capability token is in no pipeline
// message a later stage's sweep may read, nor in the approval record the
// control service reads: only the sealed form is.
func tokensConfined(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, raw := s.agent(t, 0, "demo")
	ac, _ := client.New(nc)
	req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"parked with a token"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw,
		ExecutionOptions: &api.ExecutionOptions{RequireApproval: true}}
	id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
		rec, err := ac.Status(ctx, "demo", id)
		return err == nil && rec.Status == api.StatusPendingApproval
	})
	// The token's signature part is what makes it usable.
	sig := raw[strings.LastIndexByte(raw, '.')+1:]
	// Route may read the pipeline stream by sequence (its sweep does).
	rjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleRoute)))
	pipe, err := rjs.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	info, err := pipe.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sealed := 0
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := pipe.GetMsg(ctx, seq)
		if err != nil {
			continue // acknowledged and gone
		}
		if strings.Contains(string(m.Data), sig) {
			t.Fatalf("pipeline message %d (%s) carries the raw token", seq, m.Subject)
		}
		sealed += strings.Count(string(m.Data), seal.TokenPrefix)
	}
	// The control service reads the parked call.
	cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
	cs, err := kvstore.Open(ctx, cjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := cs.Approval(ctx, "demo", id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(a.Invocation), sig) {
		t.Fatal("the approval record keeps the raw token")
	}
	if !strings.Contains(string(a.Invocation), seal.TokenPrefix) {
		t.Fatalf("the approval record keeps no sealed token: %s", a.Invocation)
	}
	// And the sealed form still works: the operator approves, authorize
	// opens it and the call runs.
	oc, _ := client.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	if _, err := oc.DecideSigned(ctx, api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true},
		s.signer(t, busauth.RoleOperator)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the approved call to succeed", func() bool {
		rec, err := ac.Status(ctx, "demo", id)
		return err == nil && rec.Status == api.StatusSuccess
	})
	t.Logf("sealed tokens seen on the pipeline: %d", sealed)
}

// busApprovals: a decision is accepted only signed with operator
// credentials, and records that operator, whatever the body says.
func busApprovals(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, raw := s.agent(t, 0, "demo")
	ac, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"needs a human"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw,
		ExecutionOptions: &api.ExecutionOptions{RequireApproval: true}}
	id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
		rec, err := ac.Status(ctx, "demo", id)
		return err == nil && rec.Status == api.StatusPendingApproval
	})
	op := s.connect(t, 0, s.creds(busauth.RoleOperator))
	oc, _ := client.New(op)
	signer := func(role busauth.Role) client.Sign {
		sg, err := busauth.SignerFromCreds(node.CredsPath(s.dataDir, role))
		if err != nil {
			t.Fatal(err)
		}
		return func(subject string, body []byte) (nats.Header, error) { return sg.Sign(nil, subject, body, time.Now()) }
	}
	d := api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true, DecidedBy: "mallory"}
	for _, tc := range []struct {
		name string
		sign client.Sign
	}{
		{"unsigned", nil},
		{"signed by a stage", signer(busauth.RoleExecute)},
		{"signed by the control service", signer(busauth.RoleControl)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := oc.DecideSigned(ctx, d, tc.sign)
			if !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EDeciderUnverified}) {
				t.Fatalf("decision: %v, want E3217", err)
			}
		})
	}
	a, err := oc.DecideSigned(ctx, d, signer(busauth.RoleOperator))
	if err != nil {
		t.Fatal(err)
	}
	if a.DecidedBy != "operator:local" {
		t.Fatalf("decided by %q, want the signing operator operator:local", a.DecidedBy)
	}
	eventually(t, 20*time.Second, "the approved call to succeed", func() bool {
		rec, err := ac.Status(ctx, "demo", id)
		return err == nil && rec.Status == api.StatusSuccess
	})

	// What the human reviewed is what runs: a parameter rewritten in the
	// parked record after the review (control credentials may write the
	// bucket) makes the reviewed approval fail (E3220), and the call stays
	// parked.
	t.Run("a parameter changed after the review", func(t *testing.T) {
		id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		reviewed, err := oc.Approval(ctx, "demo", id)
		if err != nil || reviewed.RequestDigest == "" {
			t.Fatalf("approval %+v: %v", reviewed, err)
		}
		cjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		kv, err := cjs.KeyValue(ctx, subjects.BucketApprovals)
		if err != nil {
			t.Fatal(err)
		}
		key := "demo." + subjects.Token(id)
		e, err := kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		tampered := strings.Replace(string(e.Value()), "needs a human", "rm -rf", 1)
		if tampered == string(e.Value()) {
			t.Fatal("the parked record holds no parameters to change")
		}
		if _, err := kv.Update(ctx, key, []byte(tampered), e.Revision()); err != nil {
			t.Fatal(err)
		}
		d := api.ApprovalDecision{Tenant: "demo", InvocationID: id, Approve: true, RequestDigest: reviewed.RequestDigest}
		_, err = oc.DecideSigned(ctx, d, signer(busauth.RoleOperator))
		if !errors.Is(err, &api.Error{Code: api.StateConflict, ECode: api.EApprovalMismatch}) {
			t.Fatalf("approving what was reviewed after the change: %v, want E3220", err)
		}
		if rec, err := ac.Status(ctx, "demo", id); err != nil || rec.Status != api.StatusPendingApproval {
			t.Fatalf("after the refused approval: %s %v, want still pending_approval", rec.Status, err)
		}
	})

	// A leaked control credential and key may write the approvals bucket
	// (it records decisions there) and hand calls to authorize, but a record it
	// marks approved carries no operator's signed decision: authorize
	// refuses the call (E3217).
	t.Run("an approval written with control credentials", func(t *testing.T) {
		id, err := ac.Invoke(ctx, req, client.InvokeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, "the call to wait for approval", func() bool {
			rec, err := ac.Status(ctx, "demo", id)
			return err == nil && rec.Status == api.StatusPendingApproval
		})
		wjs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleControl)))
		ws, err := kvstore.Open(ctx, wjs, kvstore.Options{Bind: true, Buckets: busauth.Rights[busauth.RoleControl].Buckets()})
		if err != nil {
			t.Fatal(err)
		}
		a, err := ws.Decide(ctx, "demo", id, kvstore.ApprovalApproved, "operator:local", "forged with control credentials", nil, nil)
		if err != nil {
			t.Fatalf("control writing the approvals bucket: %v", err)
		}
		// With the control host's signing key too: the hop passes as
		// control's, and the decision it carries still is no operator's.
		handToAuthorizeAsControl(t, ctx, s, wjs, a.Invocation)
		var rec api.Record
		eventually(t, 20*time.Second, "the call to end", func() bool {
			rec, err = ac.Status(ctx, "demo", id)
			return err == nil && rec.Status.Terminal()
		})
		if rec.Status != api.StatusPermissionDenied || rec.Error == nil || rec.Error.ECode != api.EDeciderUnverified {
			t.Fatalf("control's own approval: %s %+v, want permission_denied E3217", rec.Status, rec.Error)
		}
	})
}

// handToAuthorizeAsControl hands the parked invocation (an approval
// record's) back to authorize as the control service does after a
// decision: with control's credentials (js) and signed with control's hop
// key, as a compromised control host could.
func handToAuthorizeAsControl(t *testing.T, ctx context.Context, s *served, js jetstream.JetStream, invocation []byte) {
	t.Helper()
	var inv envelope.Invocation
	if err := json.Unmarshal(invocation, &inv); err != nil {
		t.Fatal(err)
	}
	hop, err := runner.Handoff(&inv, subjects.Authorize)
	if err != nil {
		t.Fatal(err)
	}
	hop.MsgID = ""
	k, err := busauth.LoadHopKey(s.dataDir, busauth.RoleControl)
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Publish(ctx, seal.SigningJetStream(js, seal.NewSigner(busauth.RoleControl, k)), hop); err != nil {
		t.Fatal(err)
	}
}

// refused reports whether the server refused op on subject for nc with a
// permissions violation.
func refused(t *testing.T, nc *nats.Conn, sub bool, subject string) (bool, error) {
	t.Helper()
	if sub {
		if _, err := nc.SubscribeSync(subject); err != nil {
			return false, err
		}
	} else if err := nc.Publish(subject, []byte("{}")); err != nil {
		return false, err
	}
	if err := nc.Flush(); err != nil {
		return false, err
	}
	err := nc.LastError()
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject), nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func busRoles(t *testing.T, s *served) {
	type op struct {
		what    string
		sub     bool
		subject string
		allowed bool
	}
	roles := []struct {
		name string
		dial func(t *testing.T, i int) *nats.Conn
		ops  []op
	}{
		{"agent", func(t *testing.T, i int) *nats.Conn { nc, _ := s.agent(t, i, "demo"); return nc }, []op{
			{"invoke for its tenant", false, "tool.invoke.demo", true},
			{"tenant-scoped control", false, subjects.TenantSvc("demo", subjects.SvcStatus), true},
			{"its tenant's budgets", false, subjects.TenantSvc("demo", subjects.SvcBudget), true},
			{"its tenant's pending approvals", false, subjects.TenantSvc("demo", subjects.SvcApprovalsList), true},
			{"one of its tenant's approvals", false, subjects.TenantSvc("demo", subjects.SvcApprovalsGet), true},
			{"another tenant's approvals", false, subjects.TenantSvc("other", subjects.SvcApprovalsList), false},
			{"another tenant's budgets", false, subjects.TenantSvc("other", subjects.SvcBudget), false},
			{"every tenant's approvals", false, subjects.SvcApprovalsList, false},
			{"every tenant's budgets", false, subjects.SvcBudget, false},
			{"invoke for another tenant", false, "tool.invoke.other", false},
			{"skip validate and authorize", false, "toolgate.pipe.execute.normal.demo", false},
			{"pre-publish the next hop", false, "toolgate.pipe.verify.normal.demo", false},
			{"approve its own parked call", false, subjects.SvcApproval, false},
			{"register a tool", false, subjects.SvcToolsRegister, false},
			{"push policy", false, subjects.SvcPolicyPush, false},
			{"push hooks", false, subjects.SvcHooksPush, false},
			{"revoke a token", false, subjects.SvcTokensRevoke, false},
			{"force a breaker", false, subjects.SvcBreakersSet, false},
			{"register a model", false, subjects.SvcModelsRegister, false},
			{"cancel another tenant's call", false, subjects.TenantSvc("other", subjects.SvcCancel), false},
			{"announce a cancel", false, subjects.Cancel("other", "x"), false},
			{"forge a result", false, "tool.result.demo.forged", false},
			{"forge audit", false, "audit.demo.tool.succeeded", false},
			{"un-revoke a token (purge)", false, "$JS.API.STREAM.PURGE.KV_toolgate_revocations", false},
			{"un-revoke a token (delete)", false, "$KV.toolgate_revocations.tok", false},
			{"delete AUDIT", false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{"rewrite policy", false, "$KV.toolgate_policies.active", false},
			{"rewrite tools", false, "$KV.toolgate_tools.echo", false},
			{"read another tenant's result late", false, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS.tool.result.other.x", false},
			{"read another agent's result late", false, "$JS.API.DIRECT.GET.TOOLGATE_RESULTS." + subjects.Result("demo", "did:agent:other", "x"), false},
			{"create a consumer", false, "$JS.API.CONSUMER.CREATE.AUDIT", false},
			{"live results of its own agent", true, subjects.ResultAgent("demo", "did:agent:demo"), true},
			{"live results of its tenant's other agents", true, "tool.result.demo.>", false},
			{"another agent's results", true, subjects.ResultAgent("demo", "did:agent:other"), false},
			{"live audit of its tenant (a tenant reader's)", true, "audit.demo.>", false},
			{"results of every tenant", true, "tool.result.>", false},
			{"another tenant's results", true, "tool.result.other.>", false},
			{"another tenant's audit", true, "audit.other.>", false},
			{"other agents' replies", true, "_INBOX.>", false},
			{"the pipeline", true, "toolgate.pipe.>", false},
		}},
		{"agent of another tenant", func(t *testing.T, i int) *nats.Conn { nc, _ := s.agent(t, i, "other"); return nc }, []op{
			{"invoke for its tenant", false, "tool.invoke.other", true},
			{"invoke for demo", false, "tool.invoke.demo", false},
			{"demo's results", true, "tool.result.demo.>", false},
			{"cancel demo's call", false, subjects.TenantSvc("demo", subjects.SvcCancel), false},
		}},
		{"execute", func(t *testing.T, i int) *nats.Conn { return s.connect(t, i, s.creds(busauth.RoleExecute)) }, []op{
			{"hand on", false, "toolgate.pipe.verify.normal.demo", true},
			{"skip verify", false, "toolgate.pipe.execute.normal.demo", false},
			{"publish a result", false, "tool.result.demo.x", false},
			{"publish a terminal audit event", false, "audit.demo.tool.succeeded", false},
			{"announce a start itself", false, "audit.demo.tool.invoked", false},
			{"announce a start through audit", false, "toolgate.relay.audit.demo.tool.invoked", true},
			{"emit a terminal audit event", false, "toolgate.relay.audit.demo.tool.succeeded", false},
			{"consume the pipeline live", true, "toolgate.pipe.>", false},
			{"read every reply", true, "_INBOX.>", false},
			{"delete AUDIT", false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{"purge AUDIT", false, "$JS.API.STREAM.PURGE.AUDIT", false},
			{"weaken AUDIT", false, "$JS.API.STREAM.UPDATE.AUDIT", false},
			{"un-revoke a token", false, "$KV.toolgate_revocations.tok", false},
			{"rewrite policy", false, "$KV.toolgate_policies.active", false},
			{"rewrite tools", false, "$KV.toolgate_tools.echo", false},
			{"rewrite the model catalogue", false, "$KV.toolgate_models.m", false},
			{"register a tool", false, subjects.SvcToolsRegister, false},
			{"delete a tool", false, subjects.SvcToolsDelete, false},
			{"approve", false, subjects.SvcApproval, false},
			{"push policy", false, subjects.SvcPolicyPush, false},
			{"push hooks", false, subjects.SvcHooksPush, false},
			{"revoke a token", false, subjects.SvcTokensRevoke, false},
			{"force a breaker", false, subjects.SvcBreakersSet, false},
			{"register a model", false, subjects.SvcModelsRegister, false},
			{"announce a cancel", false, subjects.Cancel("demo", "x"), false},
			{"serve the approval endpoint", true, subjects.SvcApproval, false},
			{"serve the administrative endpoints", true, subjects.SvcPolicyPush, false},
			{"serve tenant endpoints", true, subjects.TenantSvc("*", subjects.SvcStatus), false},
			{"record a status", false, "$KV.toolgate_invocations.demo.x", true},
			{"charge a budget", false, "$KV.toolgate_budgets.demo.x", false},
			{"hear cancels", true, subjects.CancelAll, true},
		}},
		{"control", func(t *testing.T, i int) *nats.Conn { return s.connect(t, i, s.creds(busauth.RoleControl)) }, []op{
			{"serve the control endpoints", true, "tool.svc.>", true},
			{"register tools", false, "$KV.toolgate_tools.echo", true},
			{"record decisions", false, "$KV.toolgate_approvals.demo.x", true},
			{"announce a cancel", false, subjects.Cancel("demo", "x"), true},
			{"hand a decided call to authorize", false, subjects.Pipe(subjects.Authorize, "normal", "demo"), true},
			{"end a cancelled call in audit", false, subjects.Pipe(subjects.Audit, "normal", "demo"), true},
			{"skip authorize", false, subjects.Pipe(subjects.Execute, "normal", "demo"), false},
			{"skip execute", false, subjects.Pipe(subjects.Verify, "normal", "demo"), false},
			{"forge a result", false, "tool.result.demo.x", false},
			{"charge a budget", false, "$KV.toolgate_budgets.demo.x", false},
			{"push policy for an operator", false, "$KV.toolgate_policies.active", true},
			{"revoke for an operator", false, "$KV.toolgate_revocations.tok", true},
			{"push hooks for an operator", false, "$KV.toolgate_hooks.demo", true},
			{"force a breaker for an operator", false, "$KV.toolgate_breakers.echo", true},
			{"register a model for an operator", false, "$KV.toolgate_models.m", true},
			{"reset rate limits", false, "$KV.toolgate_ratelimits.demo.x", false},
			{"delete AUDIT", false, "$JS.API.STREAM.DELETE.AUDIT", false},
			{"purge the revocations", false, "$JS.API.STREAM.PURGE.KV_toolgate_revocations", false},
			{"consume the pipeline live", true, "toolgate.pipe.>", false},
		}},
		{"operator", func(t *testing.T, i int) *nats.Conn { return s.connect(t, i, s.creds(busauth.RoleOperator)) }, []op{
			{"approvals", false, subjects.SvcApproval, true},
			{"push policy", false, subjects.SvcPolicyPush, true},
			{"push hooks", false, subjects.SvcHooksPush, true},
			{"revoke a token", false, subjects.SvcTokensRevoke, true},
			{"set a breaker", false, subjects.SvcBreakersSet, true},
			{"register a model", false, subjects.SvcModelsRegister, true},
			{"everything", true, ">", true},
			{"stream administration", false, "$JS.API.STREAM.INFO.AUDIT", true},
		}},
	}
	for _, r := range roles {
		t.Run(r.name, func(t *testing.T) {
			for i, o := range r.ops {
				t.Run(o.what, func(t *testing.T) {
					nc := r.dial(t, i)
					got, err := refused(t, nc, o.sub, o.subject)
					if err != nil {
						t.Fatal(err)
					}
					if got == o.allowed {
						t.Errorf("%s (sub=%v %s): refused=%v, want allowed=%v (last error %v)", o.what, o.sub, o.subject, got, o.allowed, nc.LastError())
					}
				})
			}
		})
	}
	t.Run("the audit trail cannot be deleted by a stage", func(t *testing.T) {
		nc := s.connect(t, 1, s.creds(busauth.RoleAudit))
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, subjects.StreamAudit); err == nil {
			t.Fatal("the audit role deleted AUDIT")
		}
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		op := s.connect(t, 0, s.creds(busauth.RoleOperator))
		ojs, _ := jetstream.New(op)
		if _, err := ojs.Stream(ctx, subjects.StreamAudit); err != nil {
			t.Fatalf("AUDIT after the attempt: %v", err)
		}
	})
}

// agentRoundTrip: an agent connected with its token (one with a budget, so
// its calls are counted) invokes a tool on its tenant (JetStream ack across
// accounts) and receives the result live.
func agentRoundTrip(t *testing.T, s *served) {
	raw, cl := agentToken(t, "demo", func(c *token.Claims) { c.Budget = &token.Budget{MaxCalls: 1000} })
	nc := s.connect(t, 1, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("demo", cl.ID)))
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.SubscribeSync(subjects.ResultAgent("demo", "did:agent:demo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"through the gate"}`),
		AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}, CapabilityToken: raw}
	id, err := c.Invoke(ctx, req, client.InvokeOptions{})
	if err != nil {
		t.Fatalf("agent invoke: %v", err)
	}
	for {
		m, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatalf("no result for %s: %v", id, err)
		}
		if m.Subject != subjects.Result("demo", "did:agent:demo", id) {
			continue
		}
		resp, err := client.DecodeResult(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), "through the gate") {
			t.Fatalf("result %+v, want success echoing the message", resp)
		}
		break
	}
	if s.metrics != "" {
		// Every stage runs in this one process: each after validate took
		// the invocation the stage before it handed on, not decoding it.
		in := inMemory(t, s.metrics)
		for _, st := range subjects.Stages[1:] {
			if in[st] < 1 {
				t.Errorf("stage %s took no hand-off in memory (%v)", st, in)
			}
		}
	}
	// A late reader gets the result by its subject: a direct get of the
	// results stream, the one read of it an agent may make, and only of its
	// own tenant's subjects.
	t.Run("a late read of its result", func(t *testing.T) {
		// Any replica may answer a direct get: on a cluster one that has
		// not stored the result yet answers 404 for a moment.
		var m *nats.Msg
		eventually(t, 10*time.Second, "a direct get to answer the result", func() bool {
			m, err = nc.Request("$JS.API.DIRECT.GET."+subjects.StreamResults+"."+subjects.Result("demo", "did:agent:demo", id), nil, 5*time.Second)
			return err == nil && m.Header.Get("Status") == "" && strings.Contains(string(m.Data), "through the gate")
		})
		if _, err := nc.Request("$JS.API.DIRECT.GET."+subjects.StreamResults+"."+subjects.Result("other", "did:agent:demo", id), nil, 300*time.Millisecond); err == nil {
			t.Fatal("a direct get of another tenant's result was answered")
		}
	})
	// The tenant's control endpoints answer the agent; the tenant is the
	// subject's, and a body naming another tenant is refused.
	t.Run("status on its tenant's endpoint", func(t *testing.T) {
		rec, err := c.Status(ctx, "demo", id)
		if err != nil || rec.Status != api.StatusSuccess {
			t.Fatalf("status: %+v, %v", rec, err)
		}
	})
	t.Run("body naming another tenant", func(t *testing.T) {
		m, err := nc.Request(subjects.TenantSvc("demo", subjects.SvcStatus), []byte(`{"tenant_id":"other","invocation_id":"x"}`), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Header.Get("Nats-Service-Error-Code"); got != "3014" {
			t.Fatalf("error code %q (%s), want 3014", got, m.Data)
		}
	})
	t.Run("budget and approvals on its tenant's endpoints", func(t *testing.T) {
		var claims token.Claims
		if _, _, err := jwt.NewParser().ParseUnverified(raw, &claims); err != nil {
			t.Fatal(err)
		}
		m, err := nc.Request(subjects.TenantSvc("demo", subjects.SvcBudget), []byte(`{"session":"`+token.BudgetKey(claims.Root())+`"}`), 5*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error-Code") != "" {
			t.Fatalf("budget: %v %s %s", err, m.Header.Get("Nats-Service-Error"), m.Data)
		}
		var b api.BudgetStatus
		if err := json.Unmarshal(m.Data, &b); err != nil || b.Tenant != "demo" || b.Used.Calls < 1 {
			t.Fatalf("budget %s: %v; want the call just made counted", m.Data, err)
		}
		m, err = nc.Request(subjects.TenantSvc("demo", subjects.SvcApprovalsList), nil, 5*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error-Code") != "" || !strings.Contains(string(m.Data), `"approvals":`) {
			t.Fatalf("approvals list: %v %s", err, m.Data)
		}
		m, err = nc.Request(subjects.TenantSvc("demo", subjects.SvcApprovalsList), []byte(`{"tenant_id":"other"}`), 5*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error-Code") != "3014" {
			t.Fatalf("approvals list naming another tenant: %v %q %s, want 3014", err, m.Header.Get("Nats-Service-Error-Code"), m.Data)
		}
		m, err = nc.Request(subjects.TenantSvc("demo", subjects.SvcApprovalsGet), []byte(`{"invocation_id":"`+id+`"}`), 5*time.Second)
		if err != nil || m.Header.Get("Nats-Service-Error-Code") != "3214" {
			t.Fatalf("approval of a call that needed none: %v %q %s, want 3214", err, m.Header.Get("Nats-Service-Error-Code"), m.Data)
		}
	})
	t.Run("cancel on its tenant's endpoint", func(t *testing.T) {
		rec, err := c.Cancel(ctx, "demo", id, "done anyway")
		if err != nil || rec.InvocationID != id || rec.Status != api.StatusSuccess {
			t.Fatalf("cancel: %+v, %v; want the ended call's record, unchanged", rec, err)
		}
	})
}

// busRefusals: connections refused at connect, each with its reason in an
// audit event on audit._system.bus.refused.
func busRefusals(t *testing.T, s *served) {
	revokedRaw, revoked := agentToken(t, "demo", nil)
	s.revoke(t, revoked.ID)
	other, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	forged, err := token.Mint(other, token.Claims{ToolID: token.Patterns{"*"}, TenantID: "demo", AgentDID: "did:agent:x",
		RegisteredClaims: jwt.RegisteredClaims{Issuer: testIssuer, Audience: jwt.ClaimStrings{testAudience}, ID: "forged-1",
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	if err != nil {
		t.Fatal(err)
	}
	expired, _ := agentToken(t, "demo", func(c *token.Claims) { c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Hour)) })
	foreignKeys, err := busauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	foreignCreds := filepath.Join(t.TempDir(), "op.creds")
	b, _ := foreignKeys.IssueCredentials(busauth.RoleOperator, "intruder", 0)
	if err := os.WriteFile(foreignCreds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		opts   []nats.Option
		reason string
	}{
		{"no credentials", nil, busauth.ErrNoCredentials.Error()},
		{"user and password", []nats.Option{nats.UserInfo("admin", "admin")}, busauth.ErrNoCredentials.Error()},
		{"expired token", []nats.Option{nats.Token(expired)}, busauth.ErrExpired.Error()},
		{"revoked token", []nats.Option{nats.Token(revokedRaw)}, busauth.ErrRevoked.Error()},
		{"forged token", []nats.Option{nats.Token(forged)}, busauth.ErrBadSignature.Error()},
		{"garbage token", []nats.Option{nats.Token("not-a-jwt")}, busauth.ErrBadToken.Error()},
		{"another deployment's operator", []nats.Option{busauth.CredentialsOption(foreignCreds)}, busauth.ErrUnknownIssuer.Error()},
	}
	op := s.connect(t, 0, s.creds(busauth.RoleOperator))
	ojs, _ := jetstream.New(op)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			from := auditLastSeq(t, ojs)
			nc, err := s.dial(i, tc.opts...)
			if err == nil {
				nc.Close()
				t.Fatal("admitted")
			}
			if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(err.Error(), "Authorization") {
				t.Fatalf("connect: %v, want an authorization violation", err)
			}
			// The refusal is in the audit trail with its reason.
			eventually(t, 10*time.Second, "a bus.refused audit event naming "+tc.reason, func() bool {
				return refusedAfter(ojs, from, tc.reason)
			})
		})
	}
}

// busRevoke: revoking a token closes its live connection within a second.
func busRevoke(t *testing.T, s *served) {
	raw, c := agentToken(t, "demo", nil)
	closed := make(chan struct{})
	nc := s.connect(t, 2, nats.Token(raw), nats.CustomInboxPrefix(busauth.InboxPrefix("demo", c.ID)),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }), nats.NoReconnect())
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.revoke(t, c.ID)
	select {
	case <-closed:
		t.Logf("closed %v after the revocation", time.Since(start).Round(time.Millisecond))
	case <-time.After(time.Second):
		t.Fatal("the revoked token's connection is still open after a second")
	}
	if nc2, err := s.dial(0, nats.Token(raw)); err == nil {
		nc2.Close()
		t.Fatal("a revoked token reconnected")
	}
}

// TestTokenLeavesTheEnvelopeAfterAuthorize: the hop authorize hands on
// carries what the token grants, not the token.
func TestTokenLeavesTheEnvelopeAfterAuthorize(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: []string{subjects.Validate, subjects.Authorize}})
	req := request("sealed", "echo", `{"message":"hi"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := e.client.Invoke(ctx, req, client.InvokeOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := e.js.Stream(ctx, subjects.StreamPipeline)
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	eventually(t, 15*time.Second, "authorize to hand the call to route", func() bool {
		m, err := st.GetLastMsgForSubject(ctx, subjects.Pipe(subjects.Route, "normal", "sealed"))
		if err == nil {
			body = m.Data
		}
		return err == nil
	})
	if strings.Contains(string(body), req.CapabilityToken) || strings.Contains(string(body), `"capability_token"`) {
		t.Fatalf("the hop to route carries the capability token: %s", body)
	}
	if !strings.Contains(string(body), `"authz"`) {
		t.Fatalf("the hop to route carries no authorization: %s", body)
	}
}

// TestServeMovesAnOpenStore: streams written by a toolgate from before the
// bus was authenticated (account $G) are found in account TOOLGATE.
func TestServeMovesAnOpenStore(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(old.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.StreamAudit, Subjects: []string{subjects.AuditAll}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "audit.demo.tool.succeeded", []byte(`{"kept":true}`)); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	old.Shutdown()
	old.WaitForShutdown()

	ns, gate, err := node.StartSecureEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	defer gate.Close()
	op, err := nats.Connect(ns.ClientURL(), busauth.CredentialsOption(node.CredsPath(dir, busauth.RoleOperator)))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	ojs, _ := jetstream.New(op)
	st, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatalf("AUDIT after the move: %v", err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "audit.demo.tool.succeeded")
	if err != nil || !strings.Contains(string(m.Data), "kept") {
		t.Fatalf("the old audit event: %v %v", m, err)
	}
}

// forgedHops: hops written straight onto the execute subject with route
// credentials (which may publish there) carry no seal of authorize's
// decision that verifies: execute refuses them (E3218), audit records the
// refusal as poison (E3230: no custody of a call authorize took), and the
// tool never runs.
func forgedHops(t *testing.T, s *served) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ojs, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleOperator)))
	st, err := kvstore.Open(ctx, ojs, kvstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	as, err := ojs.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	key := func(r busauth.Role) *seal.Signer { return s.hopSigner(t, r) }
	forged := func(id string) *envelope.Invocation {
		return &envelope.Invocation{ID: id, Tenant: "demo", Event: envelope.Event{ID: id, Source: "urn:forger", Seq: uint64(1e12) + uint64(time.Now().UnixNano()%1e9)},
			ReceivedAt: time.Now(), Status: api.StatusPending,
			Request: &api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"forged"}`),
				AgentContext: api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"}},
			Authz: &envelope.Authorization{TokenID: "none", AgentDID: "did:agent:demo", Session: "none",
				Grants: envelope.Grants{Paths: []string{"/"}, PathMode: "rw", Hosts: []string{"*"}}},
			Route: &envelope.Route{ToolID: "echo", ToolVersion: "2.0.0", Executor: "builtin"}}
	}
	// Every hand-off, published with the credentials of the role that may
	// send it but without that role's signing key (or with another role's
	// key), is poison at the next stage: recorded with E3224, and the
	// invocation it claims to be is never touched.
	unsigned := []struct {
		name   string
		sender busauth.Role
		next   string
		signer *seal.Signer
	}{
		{"to authorize, unsigned, with validate's credentials", busauth.RoleValidate, subjects.Authorize, nil},
		{"to route, unsigned, with authorize's credentials", busauth.RoleAuthorize, subjects.Route, nil},
		{"to execute, unsigned, with route's credentials", busauth.RoleRoute, subjects.Execute, nil},
		{"to verify, unsigned, with execute's credentials", busauth.RoleExecute, subjects.Verify, nil},
		{"an ending to audit, unsigned, with verify's credentials", busauth.RoleVerify, subjects.Audit, nil},
		{"to execute, signed by verify's key, with route's credentials", busauth.RoleRoute, subjects.Execute, key(busauth.RoleVerify)},
	}
	for i, tc := range unsigned {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("unsigned-%d-%d", i, time.Now().UnixNano())
			inv := forged(id)
			if tc.next == subjects.Audit {
				inv.Fail(subjects.Verify, api.NewError(api.InternalError, api.EInternal, "forged ending"))
			}
			hop, err := runner.Handoff(inv, tc.next)
			if err != nil {
				t.Fatal(err)
			}
			if tc.signer != nil {
				hop.Header = tc.signer.Sign(hop.Subject, hop.Header, hop.Data)
			}
			js, _ := jetstream.New(s.connect(t, 0, s.creds(tc.sender)))
			if err := runner.Publish(ctx, js, hop); err != nil {
				t.Fatalf("%s publishing onto %s: %v", tc.sender, hop.Subject, err)
			}
			eventually(t, 20*time.Second, "a poison event with E3224 for the forged hand-off", func() bool {
				m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison)))
				return err == nil && strings.Contains(string(m.Data), hop.Subject) && strings.Contains(string(m.Data), api.EMessageUnsigned) &&
					strings.Contains(string(m.Data), `"stage":"`+tc.next+`"`)
			})
			if rec, err := st.Status(ctx, "demo", id); err == nil {
				t.Fatalf("the forged hand-off touched invocation %s: %+v", id, rec)
			}
		})
	}
	// A compromised route host holds route's key too: its hop passes the
	// signature check, and execute still refuses a call authorize never
	// sealed. The call never reached authorize, so execute's refusal
	// carries no custody of it: audit records the refusal as poison and
	// leaves the invocation it names alone (else route could take any
	// future call's id this way).
	cases := []struct {
		name string
		seal func(inv *envelope.Invocation)
	}{
		{"no seal", func(*envelope.Invocation) {}},
		{"a seal made up by the forger", func(inv *envelope.Invocation) {
			inv.Authz.Seal = &envelope.Seal{Key: "N" + strings.Repeat("A", 55), Tenant: inv.Tenant, ID: inv.ID, Seq: inv.Event.Seq,
				ToolID: "echo", ToolVersion: "2.0.0", Decision: "allow", Expires: time.Now().Add(time.Hour).UnixMilli(), Sig: "AAAA"}
		}},
	}
	wjs := seal.SigningJetStream(func() jetstream.JetStream {
		js, _ := jetstream.New(s.connect(t, 0, s.creds(busauth.RoleRoute)))
		return js
	}(), key(busauth.RoleRoute))
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("forged-%d-%d", i, time.Now().UnixNano())
			inv := forged(id)
			tc.seal(inv)
			hop, err := runner.Handoff(inv, subjects.Execute)
			if err != nil {
				t.Fatal(err)
			}
			if err := runner.Publish(ctx, wjs, hop); err != nil {
				t.Fatalf("route publishing onto the execute subject: %v", err)
			}
			eventually(t, 20*time.Second, "execute's E3218 refusal recorded as poison (E3230) by audit", func() bool {
				m, err := as.GetLastMsgForSubject(ctx, subjects.AuditEvent("demo", envelope.SubjectSuffix(api.TypePoison)))
				return err == nil && strings.Contains(string(m.Data), id) && strings.Contains(string(m.Data), api.EHopUnsealed) &&
					strings.Contains(string(m.Data), api.EEndingRefused)
			})
			if rec, err := st.Status(ctx, "demo", id); err == nil {
				t.Fatalf("the forged hop touched invocation %s: %+v", id, rec)
			}
		})
	}
}

// inMemory reads toolgate_stage_handoffs_in_memory_total by stage from
// the metrics toolgate serves at addr.
func inMemory(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range families["toolgate_stage_handoffs_in_memory_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "stage" {
				got[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}
