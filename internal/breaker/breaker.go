// Package breaker holds circuit breakers per tool or external endpoint whose
// state every worker shares through KV.
//
// Each worker detects failures with a failsafe-go breaker of the tool's
// configuration (failure rate over the last N calls or the last T seconds,
// minimum calls, slow calls counted as failures). When it trips, the worker
// moves the shared state to open with a compare-and-swap; every worker
// watches the state and fails calls fast (E3401) while it is open. After the
// open wait, the first worker to call moves it to half-open with the
// configured number of trial calls, which workers take from the shared
// state, so probes are limited across all workers. Enough successful probes
// close it; a failed one opens it again. Each transition is announced once,
// by the worker whose compare-and-swap made it, as a CloudEvent on the audit
// stream. The event is written with the state, in the breaker's outbox, and
// taken out once published, so a worker that dies between the two leaves it
// for the others to announce. Operators may force a breaker open or closed.
package breaker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/google/uuid"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// Transition is the data of a breaker transition event.
type Transition struct {
	Key    string `json:"key"`
	From   string `json:"from"`
	To     string `json:"to"`
	Forced bool   `json:"forced,omitempty"`
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Store is the shared state.
type Store interface {
	TransitionBreaker(ctx context.Context, key string, change func(*kvstore.BreakerState) bool) (kvstore.BreakerState, bool, error)
}

// Breakers are this worker's view of every breaker.
type Breakers struct {
	store   Store
	publish func(context.Context, stages.Output) error
	log     *slog.Logger
	now     func() time.Time

	mu       sync.Mutex
	local    map[string]*local
	shared   map[string]kvstore.BreakerState
	checking map[string]bool // keys whose outbox recover will look at
	closed   atomic.Bool     // no more looking at outboxes
}

type local struct {
	cb      circuitbreaker.CircuitBreaker[any]
	cfg     tools.CircuitBreaker
	syncing atomic.Bool // applying shared state: not a local trip
}

// New returns Breakers over store; publish announces transitions.
func New(store Store, publish func(context.Context, stages.Output) error, log *slog.Logger) *Breakers {
	if log == nil {
		log = slog.Default()
	}
	return &Breakers{store: store, publish: publish, log: log, now: time.Now,
		local: map[string]*local{}, shared: map[string]kvstore.BreakerState{}, checking: map[string]bool{}}
}

// Close stops this worker looking at outboxes for others: its node is
// stopping, and its connection with it.
func (b *Breakers) Close() { b.closed.Store(true) }

// Key is the breaker a tool's calls go through, or "" when it has none.
func Key(m *tools.Manifest) string {
	if m.CircuitBreaker == nil {
		return ""
	}
	if m.CircuitBreaker.Key != "" {
		return m.CircuitBreaker.Key
	}
	return m.ID
}

// Held returns the shared state this worker holds for key.
func (b *Breakers) Held(key string) (kvstore.BreakerState, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.shared[key]
	return st, ok
}

// Apply takes a shared state from the watch, or from this worker's own
// write; a state older than the one held is ignored.
func (b *Breakers) Apply(st kvstore.BreakerState) {
	b.mu.Lock()
	if cur, ok := b.shared[st.Key]; ok && st.Revision != 0 && st.Revision < cur.Revision {
		b.mu.Unlock()
		return
	}
	b.shared[st.Key] = st
	l := b.local[st.Key]
	b.mu.Unlock()
	if l != nil {
		l.sync(st)
	}
	b.check(st.Key)
}

func (l *local) sync(st kvstore.BreakerState) {
	l.syncing.Store(true)
	defer l.syncing.Store(false)
	switch st.State {
	case kvstore.BreakerOpen:
		if !l.cb.IsOpen() {
			l.cb.Open()
		}
	case kvstore.BreakerClosed:
		if !l.cb.IsClosed() {
			l.cb.Close() // a fresh window after the breaker closes
		}
	}
}

// Call is one admitted call; End records how it went.
type Call struct {
	b     *Breakers
	key   string
	l     *local
	probe bool
	skip  bool
}

// Acquire admits a call of m or refuses it with circuit_breaker_open (E3401).
func (b *Breakers) Acquire(ctx context.Context, m *tools.Manifest) (*Call, error) {
	key := Key(m)
	if key == "" {
		return &Call{skip: true}, nil
	}
	l := b.breaker(key, *m.CircuitBreaker)
	b.mu.Lock()
	st, ok := b.shared[key]
	b.mu.Unlock()
	if !ok {
		st = kvstore.BreakerState{Key: key, State: kvstore.BreakerClosed}
	}
	switch {
	case st.Forced && st.State == kvstore.BreakerClosed:
		return &Call{skip: true}, nil
	case st.Forced:
		return nil, openErr(key, "forced open by "+st.By)
	case st.State == kvstore.BreakerOpen:
		wait := time.Duration(max(1, l.cfg.WaitDurationSeconds)) * time.Second
		if b.now().Before(st.Since.Add(wait)) {
			return nil, openErr(key, fmt.Sprintf("retry after %v", st.Since.Add(wait).Sub(b.now()).Round(time.Millisecond)))
		}
		// The wait is over: the first worker here opens the trial.
		if err := b.transition(ctx, key, kvstore.BreakerOpen, kvstore.BreakerHalfOpen, "open wait elapsed", func(s *kvstore.BreakerState) {
			s.Probes, s.Successes = max(1, l.cfg.HalfOpenCalls), 0
		}); err != nil {
			return nil, stages.Transient(err, 0)
		}
		fallthrough
	case st.State == kvstore.BreakerHalfOpen:
		_, won, err := b.store.TransitionBreaker(ctx, key, func(s *kvstore.BreakerState) bool {
			if s.State != kvstore.BreakerHalfOpen || s.Forced || s.Probes <= 0 {
				return false
			}
			s.Probes--
			return true
		})
		if err != nil {
			return nil, stages.Transient(err, 0)
		}
		if !won {
			return nil, openErr(key, "half-open: its trial calls are taken")
		}
		return &Call{b: b, key: key, l: l, probe: true}, nil
	}
	if !l.cb.TryAcquirePermit() {
		return nil, openErr(key, "tripped on this worker")
	}
	return &Call{b: b, key: key, l: l}, nil
}

// End records the outcome of the call: err from the tool and how long it took.
func (c *Call) End(ctx context.Context, err error, took time.Duration) {
	if c == nil || c.skip {
		return
	}
	failed := countsAsFailure(err) || (c.l.cfg.SlowCallMS > 0 && took > time.Duration(c.l.cfg.SlowCallMS)*time.Millisecond)
	if !c.probe {
		if failed {
			c.l.cb.RecordFailure() // may trip: see onOpen
		} else {
			c.l.cb.RecordSuccess()
		}
		return
	}
	ctx = context.WithoutCancel(ctx)
	var terr error
	if failed {
		terr = c.b.transition(ctx, c.key, kvstore.BreakerHalfOpen, kvstore.BreakerOpen, "a trial call failed", func(s *kvstore.BreakerState) {
			s.Probes, s.Successes = 0, 0
		})
	} else {
		need := max(1, c.l.cfg.HalfOpenCalls)
		var st kvstore.BreakerState
		st, _, terr = c.b.store.TransitionBreaker(ctx, c.key, func(s *kvstore.BreakerState) bool {
			if s.State != kvstore.BreakerHalfOpen || s.Forced {
				return false
			}
			s.Successes++
			return true
		})
		if terr == nil && st.State == kvstore.BreakerHalfOpen && st.Successes >= need {
			terr = c.b.transition(ctx, c.key, kvstore.BreakerHalfOpen, kvstore.BreakerClosed, "trial calls succeeded", func(s *kvstore.BreakerState) {
				s.Probes, s.Successes = 0, 0
			})
		}
	}
	if terr != nil {
		c.b.log.Warn("recording a trial call", "breaker", c.key, "err", terr)
	}
}

// countsAsFailure: the tool or what it called failed, not the caller.
func countsAsFailure(err error) bool {
	if err == nil {
		return false
	}
	var te *api.Error
	if !errors.As(err, &te) {
		return true // a timeout, a panic: the tool's doing
	}
	switch te.Code {
	case api.ToolExecutionError, api.Timeout, api.SandboxFailure:
		return true
	case api.ExternalAPIError, api.DocumentUnavailable:
		// A 4xx answer is the request's fault; the endpoint is up.
		return te.Retryable
	}
	return false
}

func openErr(key, why string) error {
	return api.NewError(api.CircuitBreakerOpen, api.EBreakerOpen, "circuit breaker %s is open: %s", key, why).
		AsRetryable().WithDetail("breaker", key)
}

// breaker returns the local breaker of key, building it on first use.
func (b *Breakers) breaker(key string, cfg tools.CircuitBreaker) *local {
	b.mu.Lock()
	defer b.mu.Unlock()
	if l, ok := b.local[key]; ok {
		return l
	}
	l := &local{cfg: cfg}
	rate := cfg.FailureRateThreshold
	if rate <= 0 {
		rate = 50
	}
	minCalls := uint(max(1, cfg.MinimumCalls))
	builder := circuitbreaker.NewBuilder[any]().
		WithDelay(time.Duration(max(1, cfg.WaitDurationSeconds)) * time.Second).
		OnOpen(func(circuitbreaker.StateChangedEvent) {
			if !l.syncing.Load() {
				go b.tripped(key)
			}
		})
	if cfg.WindowSeconds > 0 {
		builder = builder.WithFailureRateThreshold(rate/100, minCalls, time.Duration(cfg.WindowSeconds)*time.Second)
	} else {
		window := uint(max(int(minCalls), cfg.SlidingWindowSize))
		failures := uint(max(1, math.Ceil(rate/100*float64(window))))
		builder = builder.WithFailureThresholdRatio(failures, window)
	}
	l.cb = builder.Build()
	if st, ok := b.shared[key]; ok {
		l.sync(st)
	}
	b.local[key] = l
	return l
}

// tripped moves the shared state to open after this worker's breaker trips.
func (b *Breakers) tripped(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.transition(ctx, key, kvstore.BreakerClosed, kvstore.BreakerOpen, "failure threshold reached", nil); err != nil {
		b.log.Warn("opening breaker", "breaker", key, "err", err)
	}
}

// transition moves key from one state to another; the worker whose
// compare-and-swap makes the move announces it.
func (b *Breakers) transition(ctx context.Context, key, from, to, reason string, also func(*kvstore.BreakerState)) error {
	at := b.nowOr()
	ev, err := b.outboxEvent(Transition{Key: key, From: from, To: to, Reason: reason}, at)
	if err != nil {
		return err
	}
	st, won, err := b.store.TransitionBreaker(ctx, key, func(s *kvstore.BreakerState) bool {
		if s.State != from || s.Forced {
			return false
		}
		s.State, s.Since, s.By = to, at, ""
		if also != nil {
			also(s)
		}
		b.enqueue(s, ev)
		return true
	})
	if err != nil || !won {
		return err
	}
	b.Apply(st)
	return b.flush(ctx, st.Key, st.Unannounced)
}

// Force sets a breaker's state by hand (or releases it with state "") and
// announces it.
func Force(ctx context.Context, store Store, publish func(context.Context, stages.Output) error, key, state, by string) (kvstore.BreakerState, error) {
	return ForceSigned(ctx, store, publish, key, state, by, nil)
}

// ForceSigned is Force keeping the operator's signed request proof in the
// stored state, so that readers of signed state honour it.
func ForceSigned(ctx context.Context, store Store, publish func(context.Context, stages.Output) error, key, state, by string,
	proof *api.DecisionProof) (kvstore.BreakerState, error) {
	b := New(store, publish, nil)
	at := b.nowOr()
	var evErr error
	st, _, err := store.TransitionBreaker(ctx, key, func(s *kvstore.BreakerState) bool {
		from := s.State
		if state == "" {
			s.Forced, s.State = false, kvstore.BreakerClosed
		} else {
			s.Forced, s.State = true, state
		}
		s.Since, s.By, s.Probes, s.Successes, s.Proof = at, by, 0, 0, proof
		var ev kvstore.BreakerEvent
		ev, evErr = b.outboxEvent(Transition{Key: key, From: from, To: s.State, Forced: s.Forced, By: by, Reason: "set by an operator"}, at)
		if evErr != nil {
			return false
		}
		b.enqueue(s, ev)
		return true
	})
	if err == nil {
		err = evErr
	}
	if err != nil {
		return st, err
	}
	return st, b.flush(ctx, key, st.Unannounced)
}

// announceGrace is how long the writer of a transition has to announce it
// before the other workers watching the breaker announce it in its stead.
// The event's id is the same whoever publishes it, so the audit stream's
// duplicate window keeps one.
const announceGrace = 2 * time.Second

// outboxEvent is the transition event t, made at at, as it waits in the
// outbox.
func (b *Breakers) outboxEvent(t Transition, at time.Time) (kvstore.BreakerEvent, error) {
	typ := map[string]string{kvstore.BreakerOpen: api.TypeCircuitOpened, kvstore.BreakerHalfOpen: api.TypeCircuitHalfOpened, kvstore.BreakerClosed: api.TypeCircuitClosed}[t.To]
	if typ == "" {
		return kvstore.BreakerEvent{}, errors.New("unknown breaker state " + t.To)
	}
	data, err := json.Marshal(t)
	if err != nil {
		return kvstore.BreakerEvent{}, err
	}
	id := subjects.Token(t.Key) + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")
	return kvstore.BreakerEvent{ID: id, Type: typ, At: at, Data: data}, nil
}

// enqueue puts ev in the outbox of s, where nothing announces: a worker
// without a publisher records no event to announce.
func (b *Breakers) enqueue(s *kvstore.BreakerState, ev kvstore.BreakerEvent) {
	if b.publish != nil {
		s.Enqueue(ev)
	}
}

// flush announces events of key's outbox and takes those announced out of
// it.
func (b *Breakers) flush(ctx context.Context, key string, events []kvstore.BreakerEvent) error {
	if b.publish == nil || len(events) == 0 {
		return nil
	}
	var done []string
	var errs []error
	for _, ev := range events {
		if err := b.announce(ctx, key, ev); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, ev.ID)
	}
	if len(done) > 0 {
		st, won, err := b.store.TransitionBreaker(ctx, key, func(s *kvstore.BreakerState) bool {
			return s.Settle(done...)
		})
		if err != nil {
			errs = append(errs, err)
		} else if won {
			b.Apply(st)
		}
	}
	return errors.Join(errs...)
}

func (b *Breakers) announce(ctx context.Context, key string, ev kvstore.BreakerEvent) error {
	e := event.New()
	e.SetID(ev.ID)
	e.SetSource("urn:toolgate:breaker")
	e.SetType(ev.Type)
	e.SetSubject(key)
	e.SetTime(ev.At)
	// As raw JSON: the SDK would write plain bytes as data_base64.
	if err := e.SetData(event.ApplicationJSON, ev.Data); err != nil {
		return err
	}
	o, err := stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(ev.Type)), &e)
	if err != nil {
		return err
	}
	return b.publish(ctx, o)
}

// recover announces, in the stead of their writers, the events of key's
// outbox that waited past announceGrace, and looks again later while any
// is younger.
func (b *Breakers) recover(key string) {
	if b.closed.Load() {
		return
	}
	b.mu.Lock()
	delete(b.checking, key)
	st := b.shared[key]
	b.mu.Unlock()
	var late []kvstore.BreakerEvent
	for _, ev := range st.Unannounced {
		if time.Since(ev.At) >= announceGrace {
			late = append(late, ev)
		}
	}
	if len(late) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.flush(ctx, key, late); err != nil {
			b.log.Warn("announcing a breaker transition for its writer", "breaker", key, "err", err)
		}
	}
	b.check(key) // younger events, or a flush that failed
}

// check has recover look at key's outbox after announceGrace, once at a
// time.
func (b *Breakers) check(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.publish == nil || b.closed.Load() || b.checking[key] || len(b.shared[key].Unannounced) == 0 {
		return
	}
	b.checking[key] = true
	time.AfterFunc(announceGrace, func() { b.recover(key) })
}

func (b *Breakers) nowOr() time.Time {
	if b.now != nil {
		return b.now().UTC()
	}
	return time.Now().UTC()
}
