package node

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/subjects"
	"golang.org/x/time/rate"
)

// DefaultSiteRate is how many messages a second the hub forwards from one
// site's outbox (with a burst of as many): a site's calls send two or three
// each, and a site sending more only waits in its own outbox.
const DefaultSiteRate = 500

// siteForwarder forwards what each declared site sent to its outbox
// (subjects.StreamSite) to where it is for, at most rate messages a second
// per site, and only what the site itself signed: a site flooding its
// outbox fills its own bound (its publishes are then refused) and takes no
// more of verify's and audit's time than its rate, whatever the other
// sites and the hub are doing.
type siteForwarder struct {
	js      jetstream.JetStream // the operator's: reads the outboxes, forwards
	dataDir string
	msgs    interface {
		Sender(subject string, h nats.Header, data []byte) (busauth.Role, error)
	}
	// judges, by the stage a hand-off is for (verify, audit), the rule
	// that stage applies to a site's hand-off (seal.Messages.HandOff,
	// .Ending), when this process runs that stage and so holds its key:
	// a site's signed message for a call that is not its own is dropped
	// here, not forwarded to be refused and recorded one by one.
	judges map[string]func(busauth.Role, *envelope.Invocation) error
	// audit, when it has a JetStream, records a flood (state.refused).
	audit func() jetstream.JetStream
	rate  float64
	// every is how often a site's refused messages are summarised in the
	// trail (default a minute).
	every time.Duration
	log   *slog.Logger
}

// refusals counts what the forwarder refused of one site since it last
// said so in the trail.
type refusals struct {
	n           int
	first, last string
	said        time.Time
}

var (
	siteForwarded = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "toolgate_site_forwarded_total",
		Help: "messages the hub forwarded from a site's outbox"}, []string{"site"})
	siteDropped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "toolgate_site_dropped_total",
		Help: "messages of a site's outbox the hub dropped: not signed by the site (signature), for a subject a site may not send (subject), or for a call not the site's to hand on (call)"}, []string{"site", "reason"})
	siteFloods = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "toolgate_site_outbox_full_total",
		Help: "times the hub found a site's outbox at its bound (its publishes refused)"}, []string{"site"})
	siteOutbox = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "toolgate_site_outbox_messages",
		Help: "messages waiting in a site's outbox for the hub to forward them"}, []string{"site"})
)

func (f *siteForwarder) collectors() []prometheus.Collector {
	return []prometheus.Collector{siteForwarded, siteDropped, siteFloods, siteOutbox}
}

// run forwards until ctx ends, following the declared sites.
func (f *siteForwarder) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	running := map[string]context.CancelFunc{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		sites, err := busauth.LoadSites(f.dataDir)
		if err == nil {
			keep := map[string]bool{}
			for _, s := range sites {
				keep[s] = true
				if running[s] == nil {
					sctx, cancel := context.WithCancel(ctx)
					running[s] = cancel
					wg.Go(func() { f.site(sctx, s) })
				}
			}
			for s, cancel := range running {
				// A removed site's outbox is forwarded until the hub
				// deletes it (retireSite): it holds what the site sent
				// before its link was cut.
				if keep[s] {
					continue
				}
				if _, err := f.js.Stream(ctx, subjects.StreamSite(s)); errors.Is(err, jetstream.ErrStreamNotFound) {
					cancel()
					delete(running, s)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// site forwards one site's outbox.
func (f *siteForwarder) site(ctx context.Context, site string) {
	out := subjects.SiteForward(site)
	lim := rate.NewLimiter(rate.Limit(f.rate), max(int(f.rate), 1))
	var cons jetstream.Consumer
	var flooded time.Time // when a flood was last audited
	var refused refusals
	defer func() { f.summarise(ctx, site, &refused) }()
	for ctx.Err() == nil {
		if cons == nil {
			c, err := f.js.Consumer(ctx, out.Stream, out.Consumer)
			if err != nil {
				// Made by site add (or serve at start): wait for it.
				sleepCtx(ctx, time.Second)
				continue
			}
			cons = c
		}
		batch, err := cons.Fetch(max(int(f.rate)/4, 1), jetstream.FetchMaxWait(time.Second))
		if err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		for m := range batch.Messages() {
			if lim.Wait(ctx) != nil {
				return
			}
			f.forward(ctx, site, m, &refused)
		}
		if refused.n > 0 && time.Since(refused.said) >= cmp.Or(f.every, time.Minute) {
			f.summarise(ctx, site, &refused)
		}
		if st, err := f.js.Stream(ctx, out.Stream); err == nil {
			info := st.CachedInfo()
			siteOutbox.WithLabelValues(site).Set(float64(info.State.Msgs))
			// Nine tenths of a bound count as full: the outbox drains while
			// it is looked at, and the server tells no one what it refused.
			full := info.Config.MaxMsgs > 0 && int64(info.State.Msgs) >= info.Config.MaxMsgs*9/10 ||
				info.Config.MaxBytes > 0 && int64(info.State.Bytes) >= info.Config.MaxBytes*9/10
			if full && time.Since(flooded) >= time.Minute {
				// At most once a minute: the flood must not flood the trail.
				flooded = time.Now()
				siteFloods.WithLabelValues(site).Inc()
				f.audited(ctx, site, info.State.Msgs)
			}
		}
	}
}

// forward sends m on to the subject it is for, if its site signed it.
func (f *siteForwarder) forward(ctx context.Context, site string, m jetstream.Msg, refused *refusals) {
	to, ok := subjects.FromSiteOut(site, m.Subject())
	if !ok {
		siteDropped.WithLabelValues(site, "subject").Inc()
		_ = m.Ack()
		return
	}
	if by, err := f.msgs.Sender(to, m.Headers(), m.Data()); err != nil || by != busauth.SiteRole(site) {
		siteDropped.WithLabelValues(site, "signature").Inc()
		_ = m.Ack()
		return
	}
	if err := f.judge(site, to, m.Data()); err != nil {
		siteDropped.WithLabelValues(site, "call").Inc()
		refused.add(err)
		_ = m.Ack()
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := f.js.PublishMsg(pctx, &nats.Msg{Subject: to, Header: m.Headers(), Data: m.Data()}); err != nil {
		f.log.Warn("forwarding a site's message", "site", site, "subject", to, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	siteForwarded.WithLabelValues(site).Inc()
	_ = m.Ack()
}

// judge applies to a hand-off site signed for subject to the rule of the
// stage it is for, when the forwarder has it; what it cannot read is left
// to that stage, which refuses it as before.
func (f *siteForwarder) judge(site, to string, data []byte) error {
	stage, ok := subjects.StageOfPipe(to)
	if !ok || f.judges[stage] == nil {
		return nil
	}
	inv, err := envelope.Decode(data)
	if err != nil || inv.ID == "" {
		return nil
	}
	return f.judges[stage](busauth.SiteRole(site), inv)
}

func (r *refusals) add(err error) {
	if r.n == 0 {
		r.first = err.Error()
	}
	r.n++
	r.last = err.Error()
}

// summarise records what the forwarder refused of site since it last did,
// as one state.refused event (E3277), and starts counting again.
func (f *siteForwarder) summarise(ctx context.Context, site string, r *refusals) {
	if r.n == 0 {
		return
	}
	n, first, last := r.n, r.first, r.last
	*r = refusals{said: time.Now()}
	f.log.Warn("dropped a site's messages for calls not its own", "site", site, "messages", n, "last", last)
	err := api.NewError(api.PermissionDenied, api.ESiteRefusedSummary,
		"the hub dropped %d message(s) site %s signed for calls that are not its to hand on; first: %s; last: %s", n, site, first, last).
		WithDetail("site", site).WithDetail("count", n).WithDetail("first", first).WithDetail("last", last)
	f.record(ctx, site, "site:"+site+"/calls", uint64(time.Now().UnixNano()), err)
}

// audited records that site's outbox is full: its publishes are refused.
func (f *siteForwarder) audited(ctx context.Context, site string, held uint64) {
	f.log.Warn("a site's outbox is full: its publishes are refused", "site", site, "messages", held)
	f.record(ctx, site, "site:"+site+"/outbox", uint64(time.Now().Unix()/60),
		api.NewError(api.ResourceExhausted, api.ESiteFlood, "site %s filled its outbox (%d messages waiting): what it sends is refused until the hub has forwarded them", site, held).
			WithDetail("site", site))
}

// record audits a refusal of what site sent as state.refused (tenant
// _system), when the forwarder has audit's JetStream.
func (f *siteForwarder) record(ctx context.Context, site, what string, rev uint64, cause error) {
	js := f.audit()
	if js == nil {
		return
	}
	o, err := signedstate.RefusedEvent("urn:toolgate:execute", what, rev, cause)
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := runner.Publish(pctx, js, o); err != nil && !errors.Is(err, context.Canceled) {
		f.log.Error("auditing a refusal of a site's messages", "site", site, "what", what, "err", err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
