package chaos

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/auditchain"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/subjects"
)

// serveProc is one `toolgate serve` process group: the embedded server
// (authenticated bus, the shipped roles) and every stage.
type serveProc struct {
	t       *testing.T
	h       *harness
	data    string
	port    int
	metrics string
	log     string
	sync    string // --sync (default interval)
	workers string // --workers (default 16)
	cmd     *exec.Cmd
	done    chan struct{}
}

func (h *harness) newServe() *serveProc {
	s := &serveProc{t: h.t, h: h, data: filepath.Join(h.dir, "serve"), port: freePort(h.t),
		metrics: fmt.Sprintf("127.0.0.1:%d", freePort(h.t)), log: filepath.Join(h.dir, "serve.log")}
	h.t.Cleanup(s.kill)
	return s
}

func (s *serveProc) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.port) }

// start runs serve in a process group of its own and waits until it is ready.
func (s *serveProc) start() {
	s.t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	// --sync interval by default: a SIGKILL keeps the page cache, so fsync
	// changes nothing here but the throughput.
	s.cmd = exec.Command(filepath.Join(binDir, "toolgate"), "serve", "--data", s.data,
		"--listen", fmt.Sprintf("127.0.0.1:%d", s.port), "--sync", cmp.Or(s.sync, "interval"), "--workers", cmp.Or(s.workers, "16"), "--examples",
		"--jwks", s.h.jwks, "--token-issuer", issuer, "--token-audience", audience,
		"--file-root", s.h.root, "--sandbox", "none", "--ack-wait", ackWait.String(),
		"--metrics-addr", s.metrics, "--log-level", "warn")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}(s.cmd, s.done)
	deadline := time.Now().Add(time.Minute)
	for !s.ready() {
		if time.Now().After(deadline) {
			s.t.Fatalf("serve not ready; log:\n%s", tailFile(s.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *serveProc) ready() bool { return readyz(s.metrics) }

// kill SIGKILLs the whole process group, as a crash of the machine's
// toolgate would, and reaps it.
func (s *serveProc) kill() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// term sends SIGTERM and returns how long serve took to exit (at most
// limit, after which it is killed).
func (s *serveProc) term(limit time.Duration) time.Duration {
	start := time.Now()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(limit):
		s.kill()
	}
	s.cmd = nil
	return time.Since(start)
}

// TestChaosServeKill runs invocations through one `toolgate serve` and
// meanwhile SIGKILLs its whole process group (server and stages) and starts
// it again on the same data directory, several times. Besides lost and
// duplicated invocations it counts what the kills leave behind: messages
// still in the work queues once every invocation ended, false
// pipeline.poison events, and how long serve then takes to stop on SIGTERM.
// make chaos keeps thousands in flight; make test runs a short variant.
func TestChaosServeKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	binaries(t)
	h := newHarness(t, nil, 1)
	s := h.newServe()
	s.start()
	h.urls = []string{s.url()}
	h.opts = []nats.Option{busauth.CredentialsOption(node.CredsPath(s.data, busauth.RoleOperator))}
	// serve registers the example tools itself, signed as the operator's
	// (--examples): an unsigned registration would be refused by every
	// stage on its authenticated bus. The driven tool is registered again,
	// signed by the operator, at the rate it is driven.
	// serve registers its examples again at every start, so again after
	// each restart.
	op := operatorClient(t, h.conn(), node.CredsPath(s.data, busauth.RoleOperator))
	driven := func() {
		rctx, rcancel := context.WithTimeout(t.Context(), time.Minute)
		defer rcancel()
		if _, err := op.RegisterTool(rctx, drivenTool(t), true); err != nil {
			t.Error(err)
		}
	}
	driven()
	n, r, conc := invocations(), rate(), 8
	kills := 2
	if n > 1000 {
		r, conc, kills = max(r, 800), 400, 4
	}
	interval := time.Duration(n/r) * time.Second / time.Duration(kills+1)
	l, faults, recovery := during(func() *load { return h.drive(t.Context(), n, conc, r) }, interval, kills,
		func() time.Duration {
			start := time.Now()
			s.kill()
			s.start()
			d := time.Since(start)
			driven()
			return d
		})
	rep := h.verify(l, "serve-kill", faults, recovery, 5*time.Minute)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	js, err := jetstream.New(h.conn())
	if err != nil {
		t.Fatal(err)
	}
	left := func() int {
		total := 0
		for _, name := range []string{subjects.StreamInvoke, subjects.StreamPipeline} {
			st, err := js.Stream(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			total += int(st.CachedInfo().State.Msgs)
		}
		return total
	}
	leftovers := left()
	var midSweep time.Duration // SIGTERM while the first sweep deletes them
	atTerm := 0                // leftovers still there at that SIGTERM
	if n > 1000 && leftovers > 0 {
		// Two sweeps a minute apart delete them; serve is stopped as soon
		// as the first one is at work, and started again.
		deadline := time.Now().Add(3 * time.Minute)
		for left() == leftovers && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		atTerm = left()
		midSweep = s.term(time.Minute)
		if midSweep > 30*time.Second {
			t.Errorf("serve took %v to stop on SIGTERM while sweeping", midSweep)
		}
		s.start()
		deadline = time.Now().Add(4 * time.Minute)
		for left() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Second)
		}
	}
	remaining := left()
	audit, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := audit.Info(ctx, jetstream.WithSubjectFilter(subjects.AuditEvent(tenant, envelope.SubjectSuffix(api.TypePoison))))
	if err != nil {
		t.Fatal(err)
	}
	poison := 0
	for _, c := range info.State.Subjects {
		poison += int(c)
	}
	chain := verifyChain(ctx, t, js, s.data)
	stop := s.term(time.Minute)
	fmt.Printf("chaos serve-kill       leftovers=%d remaining=%d poison=%d stop=%v stop_mid_sweep=%v (%d left) chain=%s\n",
		leftovers, remaining, poison, stop.Round(time.Millisecond), midSweep.Round(time.Millisecond), atTerm, chain)
	rep.check(t)
	if poison > 0 {
		t.Errorf("%d pipeline.poison events for invocations that all ended", poison)
	}
	if stop > 30*time.Second {
		t.Errorf("serve took %v to stop on SIGTERM", stop)
	}
	if n > 1000 && remaining > 0 {
		t.Errorf("%d messages still in the work queues after the sweeps", remaining)
	}
}

// verifyChain waits for audit's checkpoints to cover every event AUDIT
// holds now, and checks the chain: the kills (audit's publishes
// acknowledged and never handed to its checkpointer, ranges left mid-way)
// must leave one unbroken chain. It returns what verify found.
func verifyChain(ctx context.Context, t *testing.T, js jetstream.JetStream, data string) string {
	t.Helper()
	pub, err := busauth.LoadAuditChainPublicKey(data)
	if err != nil {
		t.Fatal(err)
	}
	audit, err := js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	last := audit.CachedInfo().State.LastSeq
	deadline := time.Now().Add(time.Minute)
	for {
		tail, err := auditchain.LastCheckpoint(ctx, js)
		if err == nil && tail.Checkpoint != nil && tail.Checkpoint.Last >= last {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint covers AUDIT up to %d after a minute (%+v, %v)", last, tail, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	r, err := auditchain.Verify(ctx, auditchain.Bus{JS: js}, auditchain.Options{Key: pub, To: last})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Intact() || r.CoveredFirst != 1 || r.CoveredLast < last {
		t.Errorf("the audit chain after the kills: %+v", r)
	}
	return fmt.Sprintf("%d events in %d checkpoints, %d findings", r.Events, r.Checkpoints, len(r.Findings))
}

// operatorClient is a client on nc signing its administrative requests
// with the operator's credentials at creds.
func operatorClient(t *testing.T, nc *nats.Conn, creds string) *client.Operator {
	c, err := client.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := busauth.SignerFromCreds(creds)
	if err != nil {
		t.Fatal(err)
	}
	c.Sign = func(subject string, body []byte) (nats.Header, error) {
		return signer.Sign(nil, subject, body, time.Now())
	}
	return c
}
