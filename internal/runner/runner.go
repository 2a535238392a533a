package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Runner runs one stage: Workers goroutines share the stage's durable pull
// consumer, so running more Runners of a stage, in this process or others,
// scales it out. Run blocks until ctx is cancelled, then stops fetching,
// finishes the work in hand and returns.
//
// A worker that has processed a message publishes the stage's outputs and
// its hand-off together; the input is acked once every one of those
// publishes is acknowledged (naked if any fails), so the successor is
// always stored before the input goes. InFlight bounds the messages a
// Runner holds at once, processed or waiting for those acknowledgements:
// with more of them than Workers, a worker takes its next message without
// waiting for the acknowledgements of its last.
type Runner struct {
	Name string // the stage name, one of subjects.Stages
	// Inputs are the consumers it pulls from; nil: the stage's own
	// (subjects.Inputs). A site's execute worker pulls from its site's.
	Inputs  []subjects.Input
	Stage   stages.Stage
	JS      jetstream.JetStream
	Workers int
	// InFlight is the most messages held at once, being processed or
	// waiting for their publishes to be acknowledged; below Workers (the
	// default) it is Workers.
	InFlight int
	Log      *slog.Logger
	Metrics  *Metrics // nil: no metrics
	// AckWait is the consumer's ack wait; the Runner sends in-progress acks
	// at a third of it while a stage is busy.
	AckWait time.Duration
	// MaxDeliver is the consumer's delivery limit.
	MaxDeliver int
	// Timeout bounds one call of the stage (default 30s). Past it the Runner
	// stops sending in-progress acks, so a stage that hangs regardless loses
	// the message to redelivery and, in the end, to the delivery limit.
	// The deadline is shared by the messages started within the same
	// 32nd of it (at most 100ms), so it may come that much sooner.
	Timeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// StallAfter is how long the stage may go without pulling and without
	// settling a message before Stalled reports it (default 1 minute).
	StallAfter time.Duration
	// SweepEvery is how often the Runner looks for messages its consumers
	// left in their work-queue stream with nothing pending, and deletes,
	// ends or holds them by their invocation's state (default
	// DefaultSweepEvery; negative: never).
	SweepEvery time.Duration
	// SweepAlso, when set, names further consumers of the pipeline whose
	// messages the Runner settles and does not consume: the sites'
	// (docs/sites.md), whose workers may not read or delete a pipeline
	// message by its sequence (NoSettle). It sweeps them, and ends the
	// messages that reach their delivery limit, as its own.
	SweepAlso func() []subjects.Input
	// NoSettle says the Runner may not read or delete a message of its
	// stream by sequence (a site's worker): it neither sweeps nor ends the
	// messages that reach the delivery limit; another's SweepAlso does.
	NoSettle bool
	// Records reads status records for the sweep, which does not run
	// without them.
	Records Records
	// Senders, when set, checks who sent each input message before it is
	// read (seal.Messages.Check): a message no role that may send on its
	// subject signed is poison, whether the stage or its sweep meets it.
	// ours reports a signature this process made.
	Senders func(subject string, h nats.Header, data []byte) (ours bool, err error)
	// Endings, when set with Senders, judges each invocation handed to the
	// stage by the role that signed it (audit: seal.Messages.Ending, who
	// may end which call; verify: seal.Messages.HandOff, which site may
	// hand it which call): a refused one is poison, its invocation
	// untouched. A hand-off this process signed is judged too: its stage
	// may have ended, honestly, a call another host forged.
	Endings func(signer busauth.Role, inv *envelope.Invocation) error
	// Custody, when set, makes the custody of a call the stage hands to
	// the next one (seal.Signer.Custody): the proof, to audit, that the
	// next stage holds the call when it ends it. It names that stage, so
	// a copy read from the pipeline stream by another ends nothing.
	Custody func(holder busauth.Role, tenant, id string, seq uint64) string
	// SiteBinding, when set, binds a call route hands to a site to that
	// site, for verify (seal.Signer.SiteBinding).
	SiteBinding func(site, tenant, id string, seq uint64) string
	// EndingTag, when set, is this stage's tag in the id of its hand-offs
	// into audit (EndingID, seal.Signer.EndingTag), and of execute's into
	// verify, which every site may publish on too.
	EndingTag func(tenant, id string, seq uint64) string
	// Handed, when set, is shared by the Runners of this process: a
	// hand-off to a stage read here leaves its invocation there, and a
	// hand-off this process signed is taken from there, not decoded.
	Handed *Handed

	// KeptIngest says the invoke stream keeps each message until its call
	// ends (topology.MemoryHops): audit deletes it once it ended the call,
	// validate once it gave up on the message (ingest.go).
	KeptIngest bool
	ingest     chan uint64 // what dropIngest deletes, once Run starts

	inMemory  prometheus.Counter // Metrics.inMemory of this stage, once Run starts
	inflight  prometheus.Gauge   // Metrics.inflight of this stage, once Run starts
	series    *stageSeries       // this stage's other series, once Run starts
	tracer    trace.Tracer       // set by Run, with the name of its spans
	spanName  string
	active    atomic.Int64 // unix nanoseconds of the last pull or settled message
	waiting   atomic.Int32 // workers waiting on the pull iterator, which pulls for them
	deadlines atomic.Pointer[sharedDeadline]
	// ackDeadlines bound the waits for publish acknowledgements, which
	// last publishWait (publishTimeout when 0).
	ackDeadlines atomic.Pointer[sharedDeadline]
	publishWait  time.Duration
}

// Stalled reports why the stage takes no work, or "" while it does: it is
// stalled once StallAfter has passed since its last completed pull request
// and its last settled message, while no worker waits on a live pull. A
// stage whose fetcher stopped pulling, or whose every worker is stuck, is
// stalled; an idle stage is not (its pull requests keep completing). Run
// must have been called.
func (r *Runner) Stalled() string {
	if r.waiting.Load() > 0 {
		return ""
	}
	last := r.active.Load()
	if last == 0 {
		return "" // not started yet
	}
	after := r.StallAfter
	if after <= 0 {
		after = time.Minute
	}
	if idle := r.now().Sub(time.Unix(0, last)); idle > after {
		return fmt.Sprintf("stage %s has neither pulled nor settled a message for %v", r.Name, idle.Round(time.Second))
	}
	return ""
}

// alive records a completed pull request or a settled message.
func (r *Runner) alive() { r.active.Store(r.now().UnixNano()) }

var propagator = propagation.TraceContext{}

// Run consumes until ctx is done.
func (r *Runner) Run(ctx context.Context) error {
	if r.Workers < 1 {
		r.Workers = 1
	}
	r.InFlight = max(r.InFlight, r.Workers)
	if r.Log == nil {
		r.Log = slog.Default()
	}
	r.Log = r.Log.With("stage", r.Name)
	if r.Metrics != nil {
		r.inMemory = r.Metrics.inMemory.WithLabelValues(r.Name)
		r.inflight = r.Metrics.inflight.WithLabelValues(r.Name)
		r.series = r.Metrics.seriesOf(r.Name)
	}
	r.tracer, r.spanName = otel.Tracer(tracerName), "toolgate."+r.Name
	r.alive()
	inputs := r.inputs()
	consumers := make([]jetstream.Consumer, len(inputs))
	for i, in := range inputs {
		err := topology.Retry(ctx, r.Log, "opening consumer "+in.Consumer, func(ctx context.Context) (err error) {
			consumers[i], err = r.JS.Consumer(ctx, in.Stream, in.Consumer)
			return err
		})
		if err != nil {
			return nil // stopped before it started: nothing to drain
		}
	}
	info := consumers[0].CachedInfo()
	if r.AckWait == 0 {
		r.AckWait = info.Config.AckWait
	}
	if r.MaxDeliver == 0 {
		r.MaxDeliver = info.Config.MaxDeliver
	}
	if r.Timeout == 0 {
		r.Timeout = 30 * time.Second
	}
	subs, err := r.watchExhausted(ctx)
	if err != nil {
		return err
	}
	defer unsubscribe(subs)
	var sweeper sync.WaitGroup
	defer sweeper.Wait()
	sweepCtx, stopSweep := context.WithCancel(ctx)
	defer stopSweep() // before the Wait above: Run may end on a closed connection
	sweeper.Go(func() { r.sweep(sweepCtx) })
	if r.KeptIngest {
		r.ingest = make(chan uint64, ingestBacklog)
		sweeper.Go(func() { r.deleteIngests(sweepCtx) })
	}

	var fetchers sync.WaitGroup
	defer fetchers.Wait()
	next, err := r.source(ctx, consumers, &fetchers)
	if err != nil {
		return err
	}
	// A slot is taken before a message is and given back once it is
	// settled, which may be after its worker moved on.
	slots := make(chan struct{}, r.InFlight)
	var settling sync.WaitGroup
	defer settling.Wait()
	var wg sync.WaitGroup
	for w := range r.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := w; ; n += r.Workers {
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					return
				}
				msg, ok := next(n)
				if !ok {
					<-slots
					return
				}
				r.handle(msg, &settling, func() { <-slots })
				r.alive()
			}
		}()
	}
	wg.Wait()
	return nil
}

// source returns the function workers take their next message from; it
// reports false once ctx is done. One consumer is read through a pull
// iterator; several (one per priority, highest first) are read by one
// fetcher each that holds a single message until a worker takes it, so a
// message waits in JetStream, not in this process, while higher ones run.
func (r *Runner) source(ctx context.Context, consumers []jetstream.Consumer, fetchers *sync.WaitGroup) (func(n int) (jetstream.Msg, bool), error) {
	if len(consumers) == 1 {
		// Pull requests expire after 5 s (heartbeats every 2.5 s), so after a
		// server restart the iterator notices and pulls again within seconds,
		// not the default 30.
		iter, err := consumers[0].Messages(jetstream.PullMaxMessages(r.InFlight), jetstream.PullExpiry(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("consuming %s: %w", r.Name, err)
		}
		context.AfterFunc(ctx, iter.Drain)
		return func(int) (jetstream.Msg, bool) {
			for {
				r.waiting.Add(1)
				msg, err := iter.Next()
				r.waiting.Add(-1)
				switch {
				case err == nil:
					return msg, true
				case errors.Is(err, jetstream.ErrMsgIteratorClosed), r.JS.Conn().IsClosed():
					return nil, false
				}
				r.Log.Warn("fetching", "err", err)
				time.Sleep(100 * time.Millisecond)
			}
		}, nil
	}
	feeds := make([]chan jetstream.Msg, len(consumers))
	for i, c := range consumers {
		feeds[i] = make(chan jetstream.Msg)
		fetchers.Go(func() { r.fetch(ctx, c, feeds[i]) })
	}
	return func(n int) (jetstream.Msg, bool) { return takeByPriority(ctx, feeds, n) }, nil
}

// starveEvery: one take in this many serves the lowest waiting priority
// first, so low priorities progress under a steady stream of higher ones.
const starveEvery = 8

// takeByPriority takes the highest-priority message waiting in feeds
// (highest first), or on every starveEvery-th take the lowest; it blocks
// until one arrives or ctx is done.
func takeByPriority(ctx context.Context, feeds []chan jetstream.Msg, n int) (jetstream.Msg, bool) {
	try := func(i int) jetstream.Msg {
		select {
		case m := <-feeds[i]:
			return m
		default:
			return nil
		}
	}
	if n%starveEvery == starveEvery-1 {
		for i := len(feeds) - 1; i >= 0; i-- {
			if m := try(i); m != nil {
				return m, true
			}
		}
	}
	for i := range feeds {
		if m := try(i); m != nil {
			return m, true
		}
	}
	// Stages read three priorities: a select statement waits on them
	// without reflect.Select's allocations, on every message of a stage.
	switch len(feeds) {
	case 2:
		select {
		case m := <-feeds[0]:
			return m, true
		case m := <-feeds[1]:
			return m, true
		case <-ctx.Done():
			return nil, false
		}
	case 3:
		select {
		case m := <-feeds[0]:
			return m, true
		case m := <-feeds[1]:
			return m, true
		case m := <-feeds[2]:
			return m, true
		case <-ctx.Done():
			return nil, false
		}
	}
	cases := make([]reflect.SelectCase, 0, len(feeds)+1)
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for _, f := range feeds {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(f)})
	}
	chosen, v, _ := reflect.Select(cases)
	if chosen == 0 {
		return nil, false
	}
	return v.Interface().(jetstream.Msg), true
}

// fetch pulls messages from c, up to InFlight per pull request, and
// offers them on out in order. Every message it holds gets in-progress acks
// while it waits for a worker, and when ctx ends it naks what it holds so
// another process gets it at once.
func (r *Runner) fetch(ctx context.Context, c jetstream.Consumer, out chan<- jetstream.Msg) {
	keepAlive := time.NewTicker(max(r.AckWait/3, 100*time.Millisecond))
	defer keepAlive.Stop()
	var held []jetstream.Msg
	for ctx.Err() == nil {
		// A long poll that delivers each message as it arrives.
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		batch, err := c.Fetch(r.InFlight, jetstream.FetchContext(fctx))
		if err != nil {
			cancel()
			if ctx.Err() != nil || r.JS.Conn().IsClosed() {
				return
			}
			r.Log.Warn("fetching", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		msgs := batch.Messages()
		for msgs != nil || len(held) > 0 {
			var send chan<- jetstream.Msg // nil, and so never ready, while nothing is held
			var first jetstream.Msg
			if len(held) > 0 {
				send, first = out, held[0]
			}
			select {
			case m, ok := <-msgs:
				if !ok {
					msgs = nil
					r.alive() // the pull request ran its course
					continue
				}
				m, later := r.deferred(m)
				if later {
					continue
				}
				held = append(held, m)
			case send <- first:
				held = held[1:]
			case <-keepAlive.C:
				for _, m := range held {
					_ = m.InProgress()
				}
			case <-ctx.Done():
				for _, m := range held {
					_ = m.Nak()
				}
				cancel()
				return
			}
		}
		cancel()
	}
}

// deferred asks a stage that is a stages.Gate whether m should come back
// later, and naks it with the delay if so. A message that goes on is
// returned with the metadata the gate was asked with: the client parses
// it from the reply subject on every read.
func (r *Runner) deferred(m jetstream.Msg) (jetstream.Msg, bool) {
	g, ok := r.Stage.(stages.Gate)
	if !ok {
		return m, false
	}
	md, err := m.Metadata()
	if err != nil {
		return m, false
	}
	delay, later := g.Defer(m.Subject(), int(md.NumDelivered), r.MaxDeliver)
	if !later {
		return &readMsg{Msg: m, md: md}, false
	}
	if err := m.NakWithDelay(delay); err != nil {
		return &readMsg{Msg: m, md: md}, false // hand it on: Process decides again
	}
	if r.Metrics != nil {
		r.Metrics.messages.WithLabelValues(r.Name, outcomeRetried).Inc()
	}
	return m, true
}

// readMsg is a delivered message with its metadata read already.
type readMsg struct {
	jetstream.Msg
	md *jetstream.MsgMetadata
}

func (m *readMsg) Metadata() (*jetstream.MsgMetadata, error) { return m.md, nil }

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// decode turns a message into an invocation. A nil invocation means the
// message is not ours to read at all (poison); a non-nil error with an
// invocation means the invocation must end with that error.
// decodeOwn is envelope.DecodeOwn; tests count its calls.
var decodeOwn = envelope.DecodeOwn

func (r *Runner) decode(subject string, header nats.Header, data []byte, seq uint64) (*envelope.Invocation, error) {
	inv, err := r.read(subject, header, data, seq)
	if inv != nil && r.Endings != nil && r.Senders != nil {
		// Senders verified the signer the header names.
		if jerr := r.Endings(busauth.Role(header.Get(seal.HeaderSigner)), inv); jerr != nil {
			return nil, jerr
		}
	}
	return inv, err
}

// read is decode before the sender is judged.
func (r *Runner) read(subject string, header nats.Header, data []byte, seq uint64) (*envelope.Invocation, error) {
	decode := envelope.Decode
	if r.Senders != nil {
		// A hand-off this process signed and holds, read back unchanged:
		// its check would recompute the proof it was sent with.
		if inv := r.Handed.takeSigned(subject, header, data); inv != nil {
			if r.inMemory != nil {
				r.inMemory.Inc()
			}
			return inv, nil
		}
		ours, err := r.Senders(subject, header, data)
		if err != nil {
			return nil, err
		}
		// Checked, and perhaps the very bytes of an invocation handed on
		// in this process (read before its proof was noted).
		if inv := r.Handed.take(header.Get(jetstream.MsgIDHeader), data); inv != nil {
			if r.inMemory != nil {
				r.inMemory.Inc()
			}
			return inv, nil
		}
		if ours {
			// Bytes this process's Handoff encoded, the only writer of
			// pipeline subjects: valid JSON without a scan.
			decode = decodeOwn
		}
	}
	if d, ok := r.Stage.(stages.Decoder); ok {
		return d.Decode(subject, header, data, seq, r.now())
	}
	inv, err := decode(data)
	if err != nil || inv.ID == "" {
		return nil, fmt.Errorf("undecodable envelope: %v", err)
	}
	return inv, nil
}

// finalises reports whether the stage ends invocations (stages.Finaliser).
func (r *Runner) finalises() bool {
	_, ok := r.Stage.(stages.Finaliser)
	return ok
}

// handle processes msg and settles it; release is called once it is
// settled, which with fewer Workers than InFlight may be later, on a
// goroutine counted in settling.
func (r *Runner) handle(msg jetstream.Msg, settling *sync.WaitGroup, release func()) {
	start := r.now()
	if r.inflight != nil {
		r.inflight.Inc()
	}
	md, err := msg.Metadata()
	if err != nil {
		r.Log.Error("message without metadata", "err", err)
		_ = msg.Term()
		r.release(release)
		return
	}
	inv, derr := r.decode(msg.Subject(), msg.Headers(), msg.Data(), md.Sequence.Stream)
	if inv == nil {
		r.poison(msg, md, derr)
		r.release(release)
		return
	}

	ctx, span := r.deadline(), noSpan
	traced := !tracingOff()
	// Untraced, a span would carry its parent's context and record
	// nothing: the stage runs under the parent, which propagates the
	// same trace context, and a call that came without one carries none.
	propagates := traced || inv.TraceParent != ""
	parent := ctx
	if propagates {
		parent = propagator.Extract(ctx, invCarrier{inv})
		ctx = parent
	}
	if traced {
		tracer, spanName := r.tracer, r.spanName
		if tracer == nil { // handled outside Run
			tracer, spanName = otel.Tracer(tracerName), "toolgate."+r.Name
		}
		ctx, span = tracer.Start(parent, spanName, consumerSpan...)
		if span.IsRecording() {
			span.SetAttributes(attribute.String("toolgate.invocation_id", inv.ID),
				attribute.String("toolgate.tenant", inv.Tenant),
				attribute.Int("toolgate.delivery", int(md.NumDelivered)))
		}
	}
	if inv.Origin.TraceParent == "" && propagates {
		// Fixed at the first hop: the caller's context, or this span's when
		// the caller sent none, so every event names the same trace.
		origin := parent
		if !trace.SpanContextFromContext(parent).IsValid() {
			origin = ctx
		}
		propagator.Inject(origin, originCarrier{&inv.Origin})
	}

	var outs []stages.Output
	var perr error
	var early *announced
	if derr != nil {
		inv.Fail(r.Name, derr)
	} else {
		early = newAnnounced(r.JS)
		pctx := stages.WithMessage(ctx, int(md.NumDelivered), r.MaxDeliver, md.Stream, md.Sequence.Stream, len(msg.Data()), early.publish)
		outs, perr = r.process(pctx, msg, inv, early)
	}
	s := settle(r.Name, r.finalises(), inv, perr, int(md.NumDelivered), r.MaxDeliver)
	if inv.Error != nil {
		span.SetStatus(codes.Error, inv.Error.Error())
	}
	if cap(inv.Metadata.Stages) == 0 {
		// Room for every stage at the first hop: an invocation handed on
		// within the process keeps it, and grows no more.
		inv.Metadata.Stages = make([]api.Hop, 0, len(subjects.Stages))
	}
	inv.Metadata.Stages = append(inv.Metadata.Stages,
		api.Hop{Stage: r.Name, DurationUS: r.now().Sub(start).Microseconds()})
	if propagates {
		propagator.Inject(ctx, invCarrier{inv})
	}

	f := finishing{r: r, start: start, end: ending{status: inv.Status, received: inv.ReceivedAt},
		ingest: r.ingestOf(md, inv), span: span, release: release}
	if inv.Error != nil {
		f.end.ecode = inv.Error.ECode
	}
	pending := r.apply(msg, inv, s, outs, perr, early)
	// The settlement may hold what was announced: early is given back
	// once it is settled.
	switch {
	case !pending.waits():
		f.finish(pending.outcome)
		early.free()
	case r.Workers >= r.InFlight:
		// With a worker for every slot, the slots bound what is held, not
		// the workers: one that moved on would find a slot only where
		// another worker is idle. Waiting here saves starting a goroutine
		// and waking it, on every hop.
		f.finish(pending.wait())
		early.free()
	default:
		p := pending // on the heap only here
		settling.Go(func() {
			f.finish(p.wait())
			early.free()
		})
	}
}

// release gives back a message's slot once it is settled.
func (r *Runner) release(release func()) {
	if r.inflight != nil {
		r.inflight.Dec()
	}
	release()
}

// finishing is what handle does once a message is settled, read before it
// is handed on (Handed): from then on the invocation is the next stage's.
type finishing struct {
	r       *Runner
	start   time.Time
	end     ending
	ingest  uint64
	span    trace.Span
	release func()
}

func (f finishing) finish(outcome string) {
	r := f.r
	r.dropIngest(f.ingest, outcome)
	if r.Metrics != nil {
		now := r.now()
		r.Metrics.observe(r.series, r.Name, outcome, f.end, now.Sub(f.start), now.Sub(f.end.received))
	}
	f.span.End()
	r.release(f.release)
}

// announced are the publishes a stage announced while it worked (stages.Announce):
// sent at once, acknowledged by the time the input is acked.
type announced struct {
	mu      sync.Mutex
	outs    []stages.Output
	futures []jetstream.PubAckFuture
	js      jetstream.JetStream
	publish func(context.Context, stages.Output) error // sends on js and adds
}

// announcers are reused, with their publish function, from message to
// message: two allocations fewer a hop. One is given back once its
// message is settled; a stage announces nothing after Process returns.
var announcers = sync.Pool{New: func() any {
	a := &announced{}
	a.publish = func(_ context.Context, o stages.Output) error {
		f, err := PublishAsync(a.js, o)
		if err != nil {
			return err
		}
		a.add(o, f)
		return nil
	}
	return a
}}

func newAnnounced(js jetstream.JetStream) *announced {
	a := announcers.Get().(*announced)
	a.js = js
	return a
}

// free gives a back, empty; a nil one is nothing to give.
func (a *announced) free() {
	if a == nil {
		return
	}
	a.mu.Lock()
	clear(a.outs)
	clear(a.futures)
	a.outs, a.futures, a.js = a.outs[:0], a.futures[:0], nil
	a.mu.Unlock()
	announcers.Put(a)
}

func (a *announced) add(o stages.Output, f jetstream.PubAckFuture) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.outs = append(a.outs, o)
	a.futures = append(a.futures, f)
}

// take returns what was announced; nothing is added after Process returns.
func (a *announced) take() ([]stages.Output, []jetstream.PubAckFuture) {
	if a == nil {
		return nil, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.outs, a.futures
}

// process calls the stage, turning a panic into an internal error and keeping
// the message alive with in-progress acks while the stage works. What the
// stage announces is sent at once without waiting for its acknowledgement,
// which apply awaits with the outputs' before it acks the input: the event
// is on its way before the stage goes on, and costs no round trip.
func (r *Runner) process(ctx context.Context, msg jetstream.Msg, inv *envelope.Invocation, early *announced) (outs []stages.Output, err error) {
	// With early, ctx announces through it already (stages.WithMessage).
	if early == nil {
		ctx = stages.WithAnnounce(ctx, func(ctx context.Context, o stages.Output) error {
			pctx, cancel := context.WithTimeout(ctx, publishTimeout)
			defer cancel()
			return r.publish(pctx, o)
		})
	}
	if r.AckWait > 0 {
		// A timer, not a goroutine per message: most messages are done
		// long before the first in-progress ack is due.
		defer startKeepAlive(ctx, msg, r.AckWait/3).stop()
	}
	defer func() {
		if p := recover(); p != nil {
			r.Log.Error("stage panicked", "invocation", inv.ID, "panic", p, "stack", string(debug.Stack()))
			outs, err = nil, api.NewError(api.InternalError, api.EInternal, "%s stage failed unexpectedly", r.Name)
		}
	}()
	return r.Stage.Process(ctx, inv)
}

// keepAlive sends in-progress acks for msg every so often while its stage
// works, until stop or ctx's end.
type keepAlive struct {
	mu      sync.Mutex
	ctx     context.Context
	msg     jetstream.Msg
	every   time.Duration
	stopped bool
	t       *time.Timer
}

// keepAlives are reused, timer and all, from message to message.
var keepAlives = sync.Pool{New: func() any {
	k := &keepAlive{stopped: true}
	k.t = time.AfterFunc(time.Hour, k.fire)
	k.t.Stop()
	return k
}}

// startKeepAlive sends in-progress acks for msg every so often, until
// stop. A callback of the keepAlive's last use that was already running
// when it stopped may send one early for msg: harmless.
func startKeepAlive(ctx context.Context, msg jetstream.Msg, every time.Duration) *keepAlive {
	k := keepAlives.Get().(*keepAlive)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ctx, k.msg, k.every, k.stopped = ctx, msg, every, false
	k.t.Reset(every)
	return k
}

func (k *keepAlive) fire() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || k.ctx.Err() != nil {
		return
	}
	_ = k.msg.InProgress()
	k.t.Reset(k.every)
}

func (k *keepAlive) stop() {
	k.mu.Lock()
	k.stopped = true
	k.t.Stop()
	k.ctx, k.msg = nil, nil
	k.mu.Unlock()
	keepAlives.Put(k)
}

// pendingSettle is a settlement under way: its outcome, or while publishes are
// unacknowledged (waits), the publishes that wait settles the message on,
// returning the outcome. A struct, not a closure: one is made on every hop.
type pendingSettle struct {
	outcome string
	r       *Runner
	msg     jetstream.Msg
	id      string // the invocation's, for the log
	tenant  string
	outs    []stages.Output
	futures []jetstream.PubAckFuture
	// The hand-off, sent after outs, out of them: a hop that hands on and
	// has nothing else to send makes no slice.
	hand       stages.Output
	handFuture jetstream.PubAckFuture
}

// waits reports whether wait must be called to settle the message.
func (p *pendingSettle) waits() bool { return p.futures != nil || p.handFuture != nil }

// wait acks the message once every publish is acknowledged, or naks it if
// one fails or none comes within publishTimeout, and returns the outcome.
//
// The publishes are awaited last first: the hand-off, sent last, is mostly
// acknowledged last, so the others' acknowledgements are then read without
// blocking, and without a select or an error channel (which the client
// makes on asking).
func (p *pendingSettle) wait() string {
	var timeout <-chan struct{}
	if p.handFuture != nil {
		if err := p.r.awaitAck(p.handFuture, &timeout); err != nil {
			return p.r.failed(p.msg, p.id, p.tenant, p.hand, err)
		}
	}
	for i := len(p.futures) - 1; i >= 0; i-- {
		if err := p.r.awaitAck(p.futures[i], &timeout); err != nil {
			return p.r.failed(p.msg, p.id, p.tenant, p.outs[i], err)
		}
	}
	return p.r.acked(p.msg, p.id, p.tenant, p.outcome)
}

// awaitAck waits for f's acknowledgement, and returns why there is none.
// Its first wait sets *timeout, which bounds every later one too: a
// deadline shared by the waits started within the same slice of time,
// not a timer each, which a select would add to and take from the
// runtime's timers on every wait.
func (r *Runner) awaitAck(f jetstream.PubAckFuture, timeout *<-chan struct{}) error {
	ok := f.Ok()
	select {
	case <-ok:
		return nil
	default:
	}
	if *timeout == nil {
		wait := r.publishWait
		if wait <= 0 {
			wait = publishTimeout
		}
		*timeout = sharedContext(&r.ackDeadlines, wait).Done()
	}
	select {
	case <-ok:
		return nil
	case err := <-f.Err():
		return err
	case <-*timeout:
		return errors.New("no publish acknowledgement in time")
	}
}

// logFor is r's log naming an invocation: made only when something is
// logged, since With formats its attributes.
func (r *Runner) logFor(id, tenant string) *slog.Logger {
	return r.Log.With("invocation", id, "tenant", tenant)
}

// failed naks msg, one of whose publishes (o) failed with err, for a
// retry after its backoff.
func (r *Runner) failed(msg jetstream.Msg, id, tenant string, o stages.Output, err error) string {
	r.logFor(id, tenant).Warn("publishing", "subject", o.Subject, "err", err)
	_ = msg.NakWithDelay(backoff(delivered(msg)))
	return outcomePublishError
}

// acked acks msg, all of whose publishes are stored, and returns outcome.
func (r *Runner) acked(msg jetstream.Msg, id, tenant, outcome string) string {
	if err := msg.Ack(); err != nil {
		// The successor is published with a stable id: a redelivery is harmless.
		r.logFor(id, tenant).Warn("ack", "err", err)
	}
	return outcome
}

// delivered is how many times msg was delivered, for its backoff.
func delivered(msg jetstream.Msg) int {
	if md, err := msg.Metadata(); err == nil {
		return int(md.NumDelivered)
	}
	return 1
}

// publishTimeout bounds the wait for a publish acknowledgement.
const publishTimeout = 10 * time.Second

// apply carries out a settlement. Outputs and hand-off are published at
// once; the ack waits for all their acknowledgements, in the returned wait.
func (r *Runner) apply(msg jetstream.Msg, inv *envelope.Invocation, s settlement, outs []stages.Output, perr error, early *announced) pendingSettle {
	id, tenant := inv.ID, inv.Tenant
	log := func() *slog.Logger { return r.logFor(id, tenant) }
	switch s.act {
	case actRetry:
		if errors.Is(perr, stages.ErrOverQuota) {
			log().Debug("over the tenant's quota, put back", "delay", s.delay)
		} else {
			log().Warn("transient failure, will retry", "err", perr, "delay", s.delay)
		}
		_ = msg.NakWithDelay(s.delay)
		return pendingSettle{outcome: outcomeRetried}
	case actTerm:
		log().Error("giving up on message", "err", perr)
		if md, err := msg.Metadata(); err == nil && r.finalises() {
			// Nothing ends it after audit: the audit trail records it as
			// poison before it goes (retried by redelivery, and at the
			// delivery limit by the advisory, until that is stored).
			ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
			o, err := poisonEvent(r.Name, msg.Subject(), md.Stream, md.Sequence.Stream, perr)
			if err == nil {
				err = r.publish(ctx, o)
			}
			cancel()
			if err != nil {
				log().Warn("recording the message as poison", "err", err)
				_ = msg.NakWithDelay(backoff(int(md.NumDelivered)))
				return pendingSettle{outcome: outcomePublishError}
			}
		}
		_ = msg.TermWithReason(fmt.Sprintf("%s: %v", r.Name, perr))
		return pendingSettle{outcome: outcomeTerminated}
	}
	outcome := outcomeFinished
	if inv.Parked() {
		outcome = outcomeParked
	}
	var hand stages.Output
	forward, held := false, false
	if s.act == actForward {
		if r.Custody != nil && s.next == subjects.Next(r.Name) && s.next != subjects.Audit {
			holder := busauth.Role(s.next)
			if site := siteOf(inv, s.next); site != "" {
				// A site's call: its custody and binding name the site.
				holder = busauth.SiteRole(site)
				if r.SiteBinding != nil {
					inv.Route.SiteBinding = r.SiteBinding(site, inv.Tenant, inv.ID, inv.Event.Seq)
				}
			}
			inv.Custody = r.Custody(holder, inv.Tenant, inv.ID, inv.Event.Seq)
		}
		o, err := r.handoff(inv, s.next)
		if err != nil {
			log().Warn("handing on", "next", s.next, "err", err)
			_ = msg.NakWithDelay(backoff(delivered(msg)))
			return pendingSettle{outcome: outcomePublishError}
		}
		hand, forward = o, true
		outcome = outcomeForwarded
		if s.next != subjects.Next(r.Name) {
			outcome = outcomeEnded
		}
		// Held before it is sent, so the reader cannot get there first;
		// from here on inv is not this Runner's.
		// (A site's call is read by another process: none holds it.)
		held = siteOf(inv, s.next) == "" && r.Handed.put(s.next, o.MsgID, o.Data, inv)
	}
	announcedOuts, futures := early.take()
	if len(outs) == 0 && len(futures) == 0 && !forward {
		return pendingSettle{outcome: r.acked(msg, id, tenant, outcome)}
	}
	// The announced publishes are awaited too: an input is acked only
	// once everything its processing sent is stored.
	if len(announcedOuts) > 0 {
		outs = append(announcedOuts[:len(announcedOuts):len(announcedOuts)], outs...)
	}
	futures = futures[:len(futures):len(futures)]
	for _, o := range outs[len(futures):] {
		f, err := PublishAsync(r.JS, o)
		if err != nil {
			// Those already sent keep their ids: the redelivery's
			// publishes of them are deduplicated.
			return pendingSettle{outcome: r.failed(msg, id, tenant, o, err)}
		}
		futures = append(futures, f)
	}
	p := pendingSettle{outcome: outcome, r: r, msg: msg, id: id, tenant: tenant, outs: outs, futures: futures}
	if forward {
		// Sent last, as it always was: the successor comes after what
		// the stage sent.
		f, err := publishOwned(r.JS, hand)
		if err != nil {
			return pendingSettle{outcome: r.failed(msg, id, tenant, hand, err)}
		}
		p.hand, p.handFuture = hand, f
		if held && r.Senders != nil {
			if m := f.Msg(); m != nil {
				r.Handed.signed(hand.MsgID, m.Subject, hand.Data, m.Header)
			}
		}
	}
	return p
}

// Handoff is the message that hands inv to stage next.
func Handoff(inv *envelope.Invocation, next string) (stages.Output, error) {
	o, err := handoffUnnamed(inv, next)
	o.MsgID = HopID(inv, next)
	return o, err
}

// handoffUnnamed is Handoff without its message id.
func handoffUnnamed(inv *envelope.Invocation, next string) (stages.Output, error) {
	data, err := envelope.Encode(inv)
	if err != nil {
		return stages.Output{}, fmt.Errorf("encoding invocation: %w", err)
	}
	h := nats.Header{"Content-Type": jsonContent}
	if inv.TraceParent != "" {
		h.Set("traceparent", inv.TraceParent)
	}
	subject := subjects.Pipe(next, inv.Priority(), inv.Tenant)
	if site := siteOf(inv, next); site != "" {
		// A site's tool runs at its site: the call waits at the hub on
		// that site's subject until its worker takes it.
		subject = subjects.PipeSite(site, inv.Priority(), inv.Tenant)
	}
	return stages.Output{
		Subject: subject,
		Header:  h,
		Data:    data,
	}, nil
}

// siteOf is the site inv's hand-off to stage next goes to, "" for the
// hub's own stage.
func siteOf(inv *envelope.Invocation, next string) string {
	if next == subjects.Execute && inv.Route != nil {
		return inv.Route.Site
	}
	return ""
}

// jsonContent is every hand-off's Content-Type, shared: a header's values
// are replaced, never changed in place.
var jsonContent = []string{"application/json"}

// handoff is Handoff, with this stage's tag in the id of a hand-off into
// audit.
func (r *Runner) handoff(inv *envelope.Invocation, next string) (stages.Output, error) {
	o, err := handoffUnnamed(inv, next)
	if err != nil {
		return o, err
	}
	// Execute's hand-offs to verify are tagged as endings are: a site,
	// which may publish there, must not take the id of another's first.
	tag := ""
	if tagged := next == subjects.Audit || next == subjects.Verify && r.Name == subjects.Execute; tagged && r.EndingTag != nil {
		tag = r.EndingTag(inv.Tenant, inv.ID, inv.Event.Seq)
	}
	// The id in the header, where the client would put it: a publish
	// option would cost two allocations more. (A message's signature
	// covers its subject and data, not its headers.)
	v := hopIDValue(inv, next, tag)
	o.MsgID, o.Header[jetstream.MsgIDHeader] = v[0], v
	return o, nil
}

// idValue is a hand-off's message id and its header's one value in one
// allocation, not a string, a slice and, for a tagged id, a second
// string.
type idValue struct {
	v [1]string
	b [idMax]byte
}

// idMax fits every hand-off's id: a sequence, a digest, a stage and a tag
// (seal.Signer.EndingTag); a longer one is still made, in a second
// allocation.
const idMax = 112

// hopIDValue is EndingID(HopID(inv, next), tag) as a header's values.
func hopIDValue(inv *envelope.Invocation, next, tag string) []string {
	v := new(idValue)
	b := inv.AppendMsgID(v.b[:0], next)
	if tag != "" {
		b = append(append(b, '.'), tag...)
	}
	// b is never written again: the string can share its bytes.
	v.v[0] = unsafe.String(unsafe.SliceData(b), len(b))
	return v.v[:]
}

// EndingID is id, a hand-off's into audit, with the sender's tag
// (seal.Signer.EndingTag), so that no other role can take the id first.
// The tag goes last: the id still starts as every message of the call's
// does (msgIDKey).
func EndingID(id, tag string) string {
	if tag == "" {
		return id
	}
	return id + "." + tag
}

// HopID is the message id of inv's hand-off to stage next
// (envelope.Invocation.MsgID).
func HopID(inv *envelope.Invocation, next string) string {
	return inv.MsgID(next)
}

func (r *Runner) publish(ctx context.Context, o stages.Output) error { return Publish(ctx, r.JS, o) }

// PublishAsync sends o to its stream like Publish, without waiting for the
// acknowledgement, which the returned future brings.
func PublishAsync(js jetstream.JetStream, o stages.Output) (jetstream.PubAckFuture, error) {
	m := &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}
	return js.PublishMsgAsync(m, msgIDOpts(o)...)
}

// publishOwned is PublishAsync for o, whose header was made for this
// publish alone (Handoff's): the layers that sign and redirect it write it
// in place, without copying message and header.
func publishOwned(js jetstream.JetStream, o stages.Output) (jetstream.PubAckFuture, error) {
	m := &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}
	return seal.PublishOwnedAsync(js, m, msgIDOpts(o)...)
}

// msgIDOpts are the options that give a publish o's id, none when its
// header holds it already (the Runner's hand-offs).
func msgIDOpts(o stages.Output) []jetstream.PublishOpt {
	if o.MsgID == "" {
		return nil
	}
	if v := o.Header[jetstream.MsgIDHeader]; len(v) == 1 && v[0] == o.MsgID {
		return nil
	}
	return []jetstream.PublishOpt{jetstream.WithMsgID(o.MsgID)}
}

// Publish publishes o to its stream, deduplicated by its message id. Code
// outside the Runner that must put something into the pipeline (a decision
// on a parked invocation) uses it too.
func Publish(ctx context.Context, js jetstream.JetStream, o stages.Output) error {
	m := &nats.Msg{Subject: o.Subject, Header: o.Header, Data: o.Data}
	_, err := js.PublishMsg(ctx, m, msgIDOpts(o)...)
	return err
}

// poison ends a message no stage can read: it is terminated and recorded on
// the audit stream so that it is never dropped silently.
func (r *Runner) poison(msg jetstream.Msg, md *jetstream.MsgMetadata, cause error) {
	r.Log.Error("poison message", "subject", msg.Subject(), "seq", md.Sequence.Stream, "err", cause)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := poisonEvent(r.Name, msg.Subject(), md.Stream, md.Sequence.Stream, cause)
	if err == nil {
		err = r.publish(ctx, o)
	}
	if err != nil {
		r.Log.Warn("recording poison message", "err", err)
		_ = msg.NakWithDelay(backoff(int(md.NumDelivered)))
		return
	}
	_ = msg.TermWithReason("poison: " + cause.Error())
	if r.KeptIngest && md.Stream == subjects.StreamInvoke {
		r.dropIngest(md.Sequence.Stream, outcomeTerminated)
	}
	if r.Metrics != nil {
		r.Metrics.messages.WithLabelValues(r.Name, outcomePoison).Inc()
	}
}

const tracerName = "github.com/toolgate/toolgate/stages"

// unsetProvider is the global tracer provider before one is installed,
// which traces nothing until then.
var unsetProvider = otel.GetTracerProvider()

// noSpan is the span of a message handled untraced.
var noSpan = trace.SpanFromContext(context.Background())

// tracingOff reports whether the installed tracer provider traces nothing
// (none, or a no-op one): a stage's span is then not started, saving its
// allocations on every hop.
func tracingOff() bool {
	switch p := otel.GetTracerProvider(); p.(type) {
	case noop.TracerProvider:
		return true
	default:
		return p == unsetProvider
	}
}

// consumerSpan are the options every stage span starts with: a slice
// made once, not on every message.
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

// invCarrier exposes an invocation's trace context to the propagator.
type invCarrier struct{ inv *envelope.Invocation }

func (c invCarrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.inv.TraceParent
	case "tracestate":
		return c.inv.TraceState
	}
	return ""
}

func (c invCarrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.inv.TraceParent = value
	case "tracestate":
		c.inv.TraceState = value
	}
}

func (c invCarrier) Keys() []string { return []string{"traceparent", "tracestate"} }

// originCarrier writes a trace context into an invocation's Origin.
type originCarrier struct{ tc *envelope.TraceContext }

func (c originCarrier) Get(string) string { return "" }

func (c originCarrier) Set(key, value string) {
	switch key {
	case "traceparent":
		c.tc.TraceParent = value
	case "tracestate":
		c.tc.TraceState = value
	}
}

func (c originCarrier) Keys() []string { return nil }

// inputs are the consumers r pulls from.
func (r *Runner) inputs() []subjects.Input {
	if r.Inputs != nil {
		return r.Inputs
	}
	return subjects.Inputs(r.Name)
}
