package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/backoff"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

const (
	tenant   = "chaos"
	issuer   = "toolgate-chaos"
	audience = "toolgate"
	ledger   = "ledger.txt"
	// ackWait is short so a killed worker's messages come back quickly.
	ackWait = 4 * time.Second
)

// invocations is the number of invocations per scenario: TOOLGATE_CHAOS_N,
// else the short variant's 300.
func invocations() int {
	if n, err := strconv.Atoi(os.Getenv("TOOLGATE_CHAOS_N")); err == nil && n > 0 {
		return n
	}
	return 300
}

// harness is one scenario's servers, workers, key material and file root.
type harness struct {
	t        *testing.T
	dir      string
	root     string
	jwks     string
	token    string
	urls     []string
	replicas int
	// opts are the harness's own connection options: the operator's
	// credentials on an authenticated bus.
	opts []nats.Option

	mu      sync.Mutex
	seq     int
	workers map[string][]*worker
}

func newHarness(t *testing.T, urls []string, replicas int) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, root: filepath.Join(dir, "files"), jwks: filepath.Join(dir, "jwks.json"),
		urls: urls, replicas: replicas, workers: map[string][]*worker{}}
	if err := os.MkdirAll(h.root, 0o755); err != nil {
		t.Fatal(err)
	}
	k := keySet(t, h.jwks)
	var err error
	h.token, err = token.Mint(k, token.Claims{
		ToolID: token.Patterns{drivenToolID}, TenantID: tenant, AgentDID: "did:agent:chaos",
		Filesystem: &token.FilesystemGrant{AllowedPaths: []string{"/"}, Mode: "rw"},
		RegisteredClaims: jwt.RegisteredClaims{Issuer: issuer, Audience: jwt.ClaimStrings{audience},
			ExpiresAt: jwt.NewNumericDate(time.Now().Add(6 * time.Hour))},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, ws := range h.workers {
			for _, w := range ws {
				w.kill()
			}
		}
		if t.Failed() {
			for _, ws := range h.workers {
				for _, w := range ws {
					for _, l := range errorLines(w.log, 5) {
						t.Logf("%s: %s", filepath.Base(w.log), l)
					}
				}
			}
		}
	})
	return h
}

// setup creates the topology and registers the example tools.
func (h *harness) setup() {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := node.Open(ctx, strings.Join(h.urls, ","), "chaos-setup", topology.TopologyOptions{Replicas: h.replicas, AckWait: ackWait}, log, h.opts...)
	if err != nil {
		h.t.Fatal(err)
	}
	defer n.Close()
	if err := n.RegisterExamples(ctx); err != nil {
		h.t.Fatal(err)
	}
	doc := drivenTool(h.t)
	if _, err := n.Store.RegisterTool(ctx, doc, true); err != nil {
		h.t.Fatal(err)
	}
	if err := n.WaitForTool(ctx, drivenToolID, "1.0.0"); err != nil {
		h.t.Fatal(err)
	}
}

// drivenToolID is the tool the scenarios drive: one agent calls it at the
// scenario's rate, past the defaults where a manifest is silent (a rate
// limit per agent, calls running at once). The faults are the subject
// here, not the limits, so its manifest declares that rate.
const drivenToolID = "fs.append_file"

// drivenTool is the example manifest of drivenToolID with that rate.
func drivenTool(t *testing.T) []byte {
	ms, err := tools.Examples()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.ID != drivenToolID {
			continue
		}
		m.RateLimit = &tools.RateLimit{Requests: 1_000_000, PerSeconds: 1, Burst: 1_000_000}
		m.Limits.ConcurrentPerAgent = tools.UncountedRuns
		doc, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	t.Fatalf("no example tool %s", drivenToolID)
	return nil
}

// startAll starts per processes of every stage.
func (h *harness) startAll(per int) {
	for _, st := range subjects.Stages {
		for range per {
			h.startWorker(st)
		}
	}
}

// killRandomWorker SIGKILLs one random stage process and starts its
// replacement; it returns the stage it hit.
func (h *harness) killRandomWorker() string {
	st := subjects.Stages[rand.IntN(len(subjects.Stages))]
	h.mu.Lock()
	var live []*worker
	for _, w := range h.workers[st] {
		if !w.exited() {
			live = append(live, w)
		}
	}
	h.mu.Unlock()
	if len(live) == 0 {
		h.startWorker(st)
		return st
	}
	live[rand.IntN(len(live))].kill()
	h.startWorker(st)
	return st
}

// conn connects to the servers, reconnecting for ever.
func (h *harness) conn() *nats.Conn {
	h.t.Helper()
	nc, err := nats.Connect(strings.Join(h.urls, ","), append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond),
		nats.RetryOnFailedConnect(true)}, h.opts...)...)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(nc.Close)
	return nc
}

// load is what the publishers did.
type load struct {
	mu       sync.Mutex
	admitted map[string]bool // publish acknowledged
	refused  map[string]bool // publish failed: outcome unknown to the client
	started  time.Time
	ended    time.Time
}

// drive publishes n invocations at rate per second from conc publishers,
// each waiting for its publish ack (with a bounded wait) before the next
// one. A failed publish is not retried: the invocation counts as refused.
func (h *harness) drive(ctx context.Context, n, conc, rate int) *load {
	nc := h.conn()
	c, err := client.New(nc)
	if err != nil {
		h.t.Fatal(err)
	}
	l := &load{admitted: map[string]bool{}, refused: map[string]bool{}, started: time.Now()}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if d := time.Until(l.started.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
					time.Sleep(d)
				}
				id := fmt.Sprintf("inv-%06d", i)
				req := api.Request{ToolID: drivenToolID, CapabilityToken: h.token,
					AgentContext: api.AgentContext{AgentDID: "did:agent:chaos", TenantID: tenant},
					Parameters:   json.RawMessage(fmt.Sprintf(`{"path":%q,"content":"%s\n"}`, ledger, id))}
				pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := c.Invoke(pctx, req, client.InvokeOptions{ID: id})
				cancel()
				l.mu.Lock()
				if err != nil {
					l.refused[id] = true
				} else {
					l.admitted[id] = true
				}
				l.mu.Unlock()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	l.ended = time.Now()
	return l
}

// outcome is what the streams and the ledger say.
type outcome struct {
	results   map[string]int
	statuses  map[string]string // id → status (error code for errors)
	terminals map[string]int
	ledger    map[string]int
	resultAt  []time.Time
	foreign   int // results or audit events of ids never published
}

// read reads RESULT and AUDIT of the tenant, and the ledger file.
func (h *harness) read(ctx context.Context, js jetstream.JetStream) (*outcome, error) {
	o := &outcome{results: map[string]int{}, statuses: map[string]string{}, terminals: map[string]int{}, ledger: map[string]int{}}
	err := readStream(ctx, js, subjects.StreamResults, subjects.ResultTenant(tenant), func(m jetstream.Msg) {
		r, err := client.DecodeResult(m.Data())
		if err != nil {
			return
		}
		if r.Status == api.StatusPending {
			return
		}
		o.results[r.InvocationID]++
		st := string(r.Status)
		if r.Error != nil {
			st += "/" + string(r.Error.Code)
			if r.Error.ECode != "" {
				st += "/" + r.Error.ECode
			}
		}
		if prev := o.statuses[r.InvocationID]; prev != "" {
			st = prev + "+" + st // a second result: keep both for the report
		}
		o.statuses[r.InvocationID] = st
		if md, err := m.Metadata(); err == nil {
			o.resultAt = append(o.resultAt, md.Timestamp)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading results: %w", err)
	}
	err = readStream(ctx, js, subjects.StreamAudit, subjects.AuditTenant(tenant), func(m jetstream.Msg) {
		var e struct {
			Type    string `json:"type"`
			Subject string `json:"subject"`
		}
		if json.Unmarshal(m.Data(), &e) != nil {
			return
		}
		if terminal[e.Type] {
			o.terminals[e.Subject]++
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading audit: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(h.root, ledger))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line != "" {
			o.ledger[line]++
		}
	}
	return o, nil
}

var terminal = map[string]bool{
	api.TypeSucceeded: true, api.TypeFailed: true, api.TypeTimeout: true,
	api.TypeCancelled: true, api.TypeRejected: true, api.TypePermissionDenied: true,
	api.TypeRateLimited: true,
}

// readStream delivers every message of stream matching filter to fn. An
// empty fetch ends the read only when the consumer has nothing pending: on
// a cluster healing from faults a fetch can time out with messages left.
func readStream(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(jetstream.Msg)) error {
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return err
	}
	empty := 0
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		got, last := 0, uint64(1)
		for m := range batch.Messages() {
			fn(m)
			got++
			if md, err := m.Metadata(); err == nil {
				last = md.NumPending
			}
		}
		if err := batch.Error(); err != nil && err != nats.ErrTimeout {
			return err
		}
		if got > 0 && last == 0 {
			return nil
		}
		if got == 0 {
			info, err := c.Info(ctx)
			if err == nil && info.NumPending == 0 {
				return nil
			}
			if empty++; empty >= 5 {
				return fmt.Errorf("%s: no messages in five fetches with some pending (%v)", stream, err)
			}
		} else {
			empty = 0
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// waitQuorum waits, with backoff, until every stream the checker reads has
// a leader and a majority of its replicas current: right after a cluster's faults a
// stream can answer "no responders" or serve a consumer without quorum,
// which is the cluster healing, not a verdict on toolgate.
func waitQuorum(ctx context.Context, t *testing.T, js jetstream.JetStream) error {
	// Past a minute the caller reads through another connection.
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := quorate(ctx, js, subjects.StreamResults, subjects.StreamAudit)
		if err == nil {
			return nil
		}
		if attempt%10 == 1 {
			t.Logf("waiting for the streams' quorum (attempt %d): %v", attempt, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("streams without quorum: %w", err)
		case <-time.After(backoff.FullJitter(attempt, 200*time.Millisecond, 5*time.Second)):
		}
	}
}

func quorate(ctx context.Context, js jetstream.JetStream, streams ...string) error {
	for _, name := range streams {
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := js.Stream(ictx, name)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		cl := s.CachedInfo().Cluster
		if cl == nil {
			continue // one server
		}
		if cl.Leader == "" {
			return fmt.Errorf("%s: no leader", name)
		}
		current := 1 // the leader
		for _, p := range cl.Replicas {
			if p.Current && !p.Offline {
				current++
			}
		}
		if peers := len(cl.Replicas) + 1; current <= peers/2 {
			return fmt.Errorf("%s: %d of %d replicas current", name, current, peers)
		}
	}
	return nil
}

// report is a scenario's figures.
type report struct {
	Name       string
	Admitted   int
	Refused    int
	Lost       int // admitted, but no result or no terminal audit event
	Duplicated int // a second result, terminal audit event, or ledger line
	Statuses   map[string]int
	MaxStall   time.Duration // longest time without a result while work was pending
	Drain      time.Duration // from the last publish to the last result
	Recovery   time.Duration // longest time a fault took to heal (servers healthy again)
	Faults     int
	problems   []string
}

// verify waits until every admitted invocation has ended (or the deadline),
// then holds the outcome to the delivery guarantees.
func (h *harness) verify(l *load, name string, faults int, recovery time.Duration, wait time.Duration) report {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), wait+time.Minute)
	defer cancel()
	js, err := jetstream.New(h.conn())
	if err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	var o *outcome
	failures := 0
	for {
		var got *outcome
		if err = waitQuorum(ctx, h.t, js); err == nil {
			got, err = h.read(ctx, js)
		}
		if err == nil {
			o = got
		}
		if err == nil && h.allEnded(l, o) {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if err != nil {
			// The server this connection chose may be one whose JetStream
			// does not answer (seen after a cluster's faults): read
			// through a new connection, which picks a server at random.
			if failures++; failures%30 == 1 {
				h.t.Logf("reading the streams (%d failures): %v; reconnecting", failures, err)
			}
			old := js.Conn()
			if js2, err2 := jetstream.New(h.conn()); err2 == nil {
				js = js2
				old.Close()
			}
		}
		time.Sleep(time.Second)
	}
	if o == nil {
		h.t.Fatalf("reading the streams: %v", err)
	}
	// Late duplicates would come from redeliveries: give them an ack wait.
	time.Sleep(ackWait + time.Second)
	if err := waitQuorum(ctx, h.t, js); err != nil {
		h.t.Logf("final read: %v", err)
	}
	if o2, err := h.read(ctx, js); err == nil {
		o = o2
	}
	if !h.allEnded(l, o) {
		h.diagnose(ctx, js)
	}
	r := report{Name: name, Admitted: len(l.admitted), Refused: len(l.refused), Statuses: map[string]int{},
		Faults: faults, Recovery: recovery}
	store, _ := kvstore.Open(ctx, js, kvstore.Options{})
	for id := range l.admitted {
		if o.results[id] == 0 || o.terminals[id] == 0 {
			r.Lost++
			if len(r.problems) < 10 {
				// The status record says how far it got: no record, validate
				// never saw it; a claim (pending), a running or a terminal status.
				rec := "no status record"
				if store != nil {
					if got, err := store.Status(ctx, tenant, id); err == nil {
						rec = fmt.Sprintf("status record %s, ingest seq %d, ending %q", got.Status, got.Seq, got.Ending)
					}
				}
				r.problems = append(r.problems, fmt.Sprintf("%s admitted: %d results, %d terminal audit events, %s",
					id, o.results[id], o.terminals[id], rec))
			}
		}
	}
	ids := map[string]bool{}
	for _, m := range []map[string]int{o.results, o.terminals, o.ledger} {
		for id := range m {
			ids[id] = true
		}
	}
	for id := range ids {
		if !l.admitted[id] && !l.refused[id] {
			o.foreign++
			r.problems = append(r.problems, fmt.Sprintf("%s was never published", id))
		}
		if o.results[id] > 1 || o.terminals[id] > 1 || o.ledger[id] > 1 {
			r.Duplicated++
			if len(r.problems) < 20 {
				r.problems = append(r.problems, fmt.Sprintf("%s: %d results (%s), %d terminal audit events, %d ledger lines",
					id, o.results[id], o.statuses[id], o.terminals[id], o.ledger[id]))
			}
		}
		if s := o.statuses[id]; s == string(api.StatusSuccess) && o.ledger[id] != 1 {
			r.problems = append(r.problems, fmt.Sprintf("%s succeeded with %d ledger lines", id, o.ledger[id]))
		}
		if o.statuses[id] != "" {
			r.Statuses[o.statuses[id]]++
		}
	}
	sort.Slice(o.resultAt, func(i, j int) bool { return o.resultAt[i].Before(o.resultAt[j]) })
	for i := 1; i < len(o.resultAt); i++ {
		r.MaxStall = max(r.MaxStall, o.resultAt[i].Sub(o.resultAt[i-1]))
	}
	if n := len(o.resultAt); n > 0 {
		r.Drain = max(0, o.resultAt[n-1].Sub(l.ended))
	}
	return r
}

func (h *harness) allEnded(l *load, o *outcome) bool {
	for id := range l.admitted {
		if o.results[id] == 0 || o.terminals[id] == 0 {
			return false
		}
	}
	return true
}

// check prints the figures and fails the test on any broken guarantee.
func (r report) check(t *testing.T) {
	t.Helper()
	keys := make([]string, 0, len(r.Statuses))
	for k := range r.Statuses {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var st []string
	for _, k := range keys {
		st = append(st, fmt.Sprintf("%s=%d", k, r.Statuses[k]))
	}
	fmt.Printf("chaos %-16s admitted=%d refused=%d lost=%d duplicated=%d faults=%d max_stall=%v max_recovery=%v drain=%v statuses: %s\n",
		r.Name, r.Admitted, r.Refused, r.Lost, r.Duplicated, r.Faults, r.MaxStall.Round(time.Millisecond),
		r.Recovery.Round(time.Millisecond), r.Drain.Round(time.Millisecond), strings.Join(st, " "))
	for _, p := range r.problems {
		t.Error(p)
	}
	if r.Lost > 0 || r.Duplicated > 0 {
		t.Errorf("%s: %d lost, %d duplicated", r.Name, r.Lost, r.Duplicated)
	}
	if r.Admitted == 0 {
		t.Errorf("%s: nothing admitted", r.Name)
	}
	if r.Statuses[string(api.StatusSuccess)] == 0 {
		t.Errorf("%s: no call ran its tool to success", r.Name)
	}
}

// diagnose logs where unfinished work sits: each stage consumer's pending,
// in-flight and redelivered counts, and the live processes of each stage.
func (h *harness) diagnose(ctx context.Context, js jetstream.JetStream) {
	for _, st := range subjects.Stages {
		for _, in := range subjects.Inputs(st) {
			c, err := js.Consumer(ctx, in.Stream, in.Consumer)
			if err != nil {
				h.t.Logf("consumer %s: %v", in.Consumer, err)
				continue
			}
			i := c.CachedInfo()
			h.t.Logf("consumer %s: pending=%d ack_pending=%d redelivered=%d waiting=%d", in.Consumer,
				i.NumPending, i.NumAckPending, i.NumRedelivered, i.NumWaiting)
		}
		h.mu.Lock()
		for _, w := range h.workers[st] {
			if w.exited() {
				h.t.Logf("%s exited: %s", filepath.Base(w.log), tailFile(w.log, 5))
			} else {
				h.t.Logf("%s live, ready=%v", filepath.Base(w.log), w.ready())
				if i, err := js.Consumer(ctx, subjects.StreamPipeline, st+"-normal"); st != subjects.Validate && err == nil && i.CachedInfo().NumPending > 0 {
					// A live process that does not pull: its goroutines say where it waits.
					_ = w.cmd.Process.Signal(syscall.SIGQUIT)
					<-w.done
					h.t.Logf("%s goroutines:\n%s", filepath.Base(w.log), stacksIn(w.log, "toolgate/"))
				}
			}
		}
		h.mu.Unlock()
	}
}

// stacksIn returns the goroutine stacks of a Go crash dump in path that
// mention pkg, the first 12 lines of each, at most 20 of them.
func stacksIn(path, pkg string) string {
	b, _ := os.ReadFile(path)
	i := strings.Index(string(b), "goroutine ")
	if i < 0 {
		return "(no dump)"
	}
	var out []string
	for _, g := range strings.Split(string(b[i:]), "\n\n") {
		if strings.Contains(g, pkg) && len(out) < 20 {
			lines := strings.Split(g, "\n")
			out = append(out, strings.Join(lines[:min(len(lines), 12)], "\n"))
		}
	}
	return strings.Join(out, "\n\n")
}

// keySet makes a signing key for capability tokens and writes its public
// key set to jwks, for the processes' --jwks.
func keySet(t *testing.T, jwks string) *token.SigningKey {
	t.Helper()
	k, err := token.GenerateSigningKey(token.AlgEdDSA)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := k.PublicJWKS()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jwks, pub, 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}
