package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/control"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/runner"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// A site (docs/sites.md) runs execute where its tools' data lives: its
// process embeds a NATS server that is a leaf node of the hub's, and its
// worker talks to the hub through that link only. The site's server keeps
// no JetStream of its own: the calls, buckets and trail stay at the hub,
// where the worker reaches them across the leaf connection, so there is no
// second JetStream (and no domain) to keep apart. The hub admits the
// link with the site's credentials alone and grants it the site's rights
// (busauth.SiteRights): what the worker may do, the link may carry.

// DefaultSiteWait is StageConfig.SiteWait's default: how long a call may
// wait at the hub for its site.
const DefaultSiteWait = time.Hour

// SiteOptions configure a site's leaf server.
type SiteOptions struct {
	// Hub is the hub's leaf-node URL, nats-leaf://host:port (serve
	// --leaf-listen).
	Hub string
	// Creds are the site's credentials (toolgate site add).
	Creds string
	// Name is the site's name: the server's too.
	Name string
	// Logging turns on the server's own log on stderr.
	Logging bool
}

// StartSiteLeaf starts a site's server: no client port (the worker
// connects in-process), no JetStream, one leaf-node remote to the hub that
// it redials for as long as it runs (every second while the link is down).
func StartSiteLeaf(o SiteOptions, log *slog.Logger) (*server.Server, error) {
	u, err := url.Parse(o.Hub)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("site: hub URL %q: want nats-leaf://host:port", o.Hub)
	}
	if u.Scheme == "" || u.Scheme == "nats" {
		u.Scheme = "nats-leaf"
	}
	if _, err := strconv.Atoi(u.Port()); err != nil {
		return nil, fmt.Errorf("site: hub URL %q has no port", o.Hub)
	}
	// The hub's server is configured with accounts, so it drops a
	// CONNECT's user JWT: the link carries the nkey and its nonce
	// signature, and the JWT as its token, as toolgate's clients do.
	creds, err := os.ReadFile(o.Creds)
	if err != nil {
		return nil, fmt.Errorf("site credentials: %w", err)
	}
	tok, seed, err := busauth.SplitCreds(creds)
	if err != nil {
		return nil, fmt.Errorf("site credentials %s: %w", o.Creds, err)
	}
	remote := *u
	remote.User = url.User(tok)
	opts := &server.Options{
		ServerName: "toolgate-site-" + o.Name,
		DontListen: true,
		// The worker's credentials sign the nonce although this server
		// checks nothing: the hub checks the link's.
		AlwaysEnableNonce: true,
		NoSigs:            true,
		NoLog:             !o.Logging,
		MaxPayload:        8 << 20,
		LeafNode: server.LeafNodeOpts{
			ReconnectInterval: time.Second,
			Remotes: []*server.RemoteLeafOpts{{
				URLs: []*url.URL{&remote}, Nkey: string(seed),
			}},
		},
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("configuring the site's NATS server: %w", err)
	}
	if o.Logging {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("the site's NATS server did not start")
	}
	log.Info("site NATS started, leaf node of the hub", "site", o.Name, "hub", u.Redacted())
	return ns, nil
}

// startSite is startBus at a site: its leaf server, and the execute
// worker's connection to it with the site's credentials (they sign the
// nonce and set the inbox; the hub checks the link's).
func (r *run) startSite() (stop func(), err error) {
	c := &r.c
	ns, err := StartSiteLeaf(SiteOptions{Hub: c.Hub, Creds: c.Creds, Name: c.Site, Logging: c.Embedded.Logging}, r.log)
	if err != nil {
		return nil, err
	}
	r.url = ns.ClientURL()
	r.base = append(r.base, nats.InProcessServer(ns))
	r.roleCreds[busauth.RoleExecute] = c.Creds
	r.credsPath = c.Creds
	r.authenticated = true
	return func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}, nil
}

// ensureSites has the operator's connection, when this process holds it,
// create the execute consumers of the sites toolgate site add declared in
// the data directory, so that their calls wait at the hub from the start.
func (r *run) ensureSites(ctx context.Context) error {
	if r.op == nil || r.c.Embedded.DataDir == "" || r.c.Site != "" {
		return nil
	}
	sites, err := busauth.LoadSites(r.c.Embedded.DataDir)
	if err != nil {
		return err
	}
	if r.reg != nil {
		r.reg.MustRegister(&siteCollector{js: r.op.JS, dataDir: r.c.Embedded.DataDir})
	}
	if err := topology.EnsureSites(ctx, r.op.JS, r.c.Topology, sites); err != nil {
		return err
	}
	if r.c.Embedded.LeafListen != "" && r.c.Stage.Messages != nil {
		// The sites' outboxes, forwarded for as long as the hub runs.
		f := &siteForwarder{js: r.op.JS, dataDir: r.c.Embedded.DataDir, msgs: r.c.Stage.Messages,
			rate: float64(cmp.Or(max(r.c.SiteRate, 0), DefaultSiteRate)), log: r.log, audit: func() jetstream.JetStream { return nil }}
		if n := r.nodes.stage[subjects.Execute]; n != nil {
			f.audit = n.refusalJS
		}
		f.judges = map[string]func(busauth.Role, *envelope.Invocation) error{}
		if r.nodes.stage[subjects.Verify] != nil {
			f.judges[subjects.Verify] = r.c.Stage.Messages.HandOff
		}
		if r.nodes.stage[subjects.Audit] != nil {
			f.judges[subjects.Audit] = r.c.Stage.Messages.Ending
		}
		if r.reg != nil {
			r.reg.MustRegister(f.collectors()...)
		}
		r.bg.Go(func() { f.run(r.runCtx) })
	}
	return nil
}

// SiteState is a site's state as the hub sees it (toolgate site list).
type SiteState struct {
	Site string `json:"site"`
	// Link is "up" while the site's worker has pulls waiting at the hub
	// (it renews them every few seconds), else "down".
	Link string `json:"link"`
	// Workers are the pulls the site's worker has waiting.
	Workers int `json:"workers"`
	// Queued are the calls waiting for the site; Running those it holds.
	Queued  uint64 `json:"queued"`
	Running int    `json:"running"`
	// LastContact is when the site last asked for calls, took one or
	// acknowledged one.
	LastContact *time.Time `json:"last_contact,omitempty"`
}

// SiteStatus reads site's state from its consumers at the hub.
func SiteStatus(ctx context.Context, js jetstream.JetStream, site string) (SiteState, error) {
	st := SiteState{Site: site, Link: "down"}
	later := func(t *time.Time) {
		if t != nil && (st.LastContact == nil || t.After(*st.LastContact)) {
			st.LastContact = t
		}
	}
	for _, in := range subjects.SiteInputs(site) {
		c, err := js.Consumer(ctx, in.Stream, in.Consumer)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return st, err
		}
		info := c.CachedInfo()
		st.Workers += info.NumWaiting
		st.Queued += info.NumPending
		st.Running += info.NumAckPending
		later(info.Delivered.Last)
		later(info.AckFloor.Last)
		if info.NumWaiting > 0 {
			now := info.TimeStamp
			later(&now)
		}
	}
	if st.Workers > 0 {
		st.Link = "up"
	}
	return st, nil
}

// siteCollector exports each declared site's state from the hub.
type siteCollector struct {
	js      jetstream.JetStream
	dataDir string // whose declared sites it reads at each scrape
}

var (
	siteUpDesc      = prometheus.NewDesc("toolgate_site_up", "1 while the site's worker waits for calls at the hub (its link is up)", []string{"site"}, nil)
	siteQueuedDesc  = prometheus.NewDesc("toolgate_site_queued", "calls waiting at the hub for the site", []string{"site"}, nil)
	siteRunningDesc = prometheus.NewDesc("toolgate_site_running", "calls the site's worker holds", []string{"site"}, nil)
	siteContactDesc = prometheus.NewDesc("toolgate_site_last_contact_seconds", "when the site last asked for, took or acknowledged a call (Unix time)", []string{"site"}, nil)
)

func (c *siteCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- siteUpDesc
	ch <- siteQueuedDesc
	ch <- siteRunningDesc
	ch <- siteContactDesc
}

func (c *siteCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	sites, err := busauth.LoadSites(c.dataDir)
	if err != nil {
		return
	}
	for _, site := range sites {
		st, err := SiteStatus(ctx, c.js, site)
		if err != nil {
			continue
		}
		up := 0.0
		if st.Link == "up" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(siteUpDesc, prometheus.GaugeValue, up, site)
		ch <- prometheus.MustNewConstMetric(siteQueuedDesc, prometheus.GaugeValue, float64(st.Queued), site)
		ch <- prometheus.MustNewConstMetric(siteRunningDesc, prometheus.GaugeValue, float64(st.Running), site)
		if st.LastContact != nil {
			ch <- prometheus.MustNewConstMetric(siteContactDesc, prometheus.GaugeValue, float64(st.LastContact.Unix()), site)
		}
	}
}

// siteCheck is check, refusing also a manifest that names a site the
// deployment has not declared in dataDir (toolgate site add): its calls
// would wait for a worker that can never come.
func siteCheck(dataDir string, check func(*tools.Manifest) error) func(*tools.Manifest) error {
	return func(m *tools.Manifest) error {
		if m.Site != "" {
			sites, err := busauth.LoadSites(dataDir)
			if err != nil {
				return fmt.Errorf("reading the declared sites: %w", err)
			}
			if !slices.Contains(sites, m.Site) {
				return api.NewError(api.InvalidParameters, api.EUnknownSite,
					"%s names site %q, which this deployment has not declared (toolgate site add %s)", m.Key(), m.Site, m.Site).
					WithDetail("site", m.Site)
			}
		}
		return check(m)
	}
}

// hubSites declares and removes sites for the control service
// (control.SiteAdmin): in the hub's data directory, which its server's
// authentication, registration and verify and audit read, and on its
// server, whose links of a removed site it cuts.
type hubSites struct {
	dataDir string
	auth    *busauth.InProcess
	// js, when set, is the operator's: it makes a new site's consumers.
	js   jetstream.JetStream
	topo topology.TopologyOptions
	// retire, when set, settles what a removed site leaves at the hub, in
	// the background (run.retireSite).
	retire func(site string)
}

var _ control.SiteAdmin = (*hubSites)(nil)

func (s *hubSites) AddSite(ctx context.Context, r api.SiteRequest) (api.SiteAdded, error) {
	tok, err := busauth.DeclareSite(s.dataDir, r.Site, r.UserKey, r.SigningKey)
	if errors.Is(err, busauth.ErrBadIdentity) {
		return api.SiteAdded{}, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid, "%v", err)
	}
	if err != nil {
		return api.SiteAdded{}, err
	}
	files, err := busauth.SiteBundleFiles(s.dataDir)
	if err != nil {
		return api.SiteAdded{}, err
	}
	// A site declared again: the links of its earlier credentials end.
	s.auth.CutSite(r.Site)
	out := api.SiteAdded{Site: r.Site, JWT: tok, Files: map[string]string{}}
	for name, b := range files {
		out.Files[name] = string(b)
	}
	out.Consumers = s.js != nil && topology.EnsureSites(ctx, s.js, s.topo, []string{r.Site}) == nil
	return out, nil
}

func (s *hubSites) RemoveSite(_ context.Context, site string) (api.SiteRemoved, error) {
	err := busauth.RemoveSite(s.dataDir, site)
	if errors.Is(err, busauth.ErrUnknownSite) {
		return api.SiteRemoved{}, api.NewError(api.InvalidParameters, api.ESiteNotDeclared, "no site %q is declared", site).WithDetail("site", site)
	}
	if err != nil {
		return api.SiteRemoved{}, err
	}
	out := api.SiteRemoved{Site: site, LinksCut: s.auth.CutSite(site)}
	if s.retire != nil {
		s.retire(site)
	}
	return out, nil
}

// retireSite settles, once its link is cut, what the removed site leaves
// at the hub: the hub forwards what its outbox still holds (what it sent
// before the cut), its hub's execute ends each call waiting for it with
// E3273 (as route ends a new one), and its consumers and outbox go. It
// runs in the background: the calls may be many, and the operator's
// request is answered at once.
func (r *run) retireSite(site string) {
	var exec *runner.Runner
	for _, rn := range r.runners {
		if rn.Name == subjects.Execute {
			exec = rn
		}
	}
	if r.op == nil || exec == nil {
		return
	}
	js, dir := r.op.JS, r.c.Embedded.DataDir
	r.bg.Go(func() {
		ctx, cancel := context.WithTimeout(r.runCtx, 5*time.Minute)
		defer cancel()
		out := subjects.SiteForward(site)
		// The forwarder drains the outbox: nothing more comes in, the link
		// being cut.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); sleepCtx(ctx, 250*time.Millisecond) {
			st, err := js.Stream(ctx, out.Stream)
			if err != nil || st.CachedInfo().State.Msgs == 0 {
				break
			}
		}
		ended, err := exec.EndWaiting(ctx, js, subjects.StreamPipeline, subjects.PipeSiteAll(site),
			api.NewError(api.ToolExecutionError, api.ESiteRemoved, "site %q was removed while the call waited for it: it has nowhere to run", site).
				WithDetail("site", site))
		if err != nil {
			r.log.Error("ending the calls waiting for a removed site", "site", site, "ended", ended, "err", err)
			return
		}
		if sites, err := busauth.LoadSites(dir); err != nil || slices.Contains(sites, site) {
			return // declared again meanwhile: its consumers are the new site's
		}
		for _, in := range subjects.SiteInputs(site) {
			if err := js.DeleteConsumer(ctx, in.Stream, in.Consumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				r.log.Warn("deleting a removed site's consumer", "site", site, "consumer", in.Consumer, "err", err)
			}
		}
		if err := js.DeleteStream(ctx, out.Stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			r.log.Warn("deleting a removed site's outbox", "site", site, "err", err)
		}
		r.log.Info("removed site settled", "site", site, "calls_ended", ended)
	})
}
