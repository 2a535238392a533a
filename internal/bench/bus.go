package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

const (
	busConnects = 200
	busRequests = 5000
)

// BusCost compares one operation on an open server and on an
// authenticated one (serve's embedded server with the auth callout).
type BusCost struct {
	Name        string
	Open, Authn Cost
}

// measureBus times connecting (TCP, CONNECT and, on the authenticated
// server, the callout's answer) and a core request-reply round trip on an
// open server beside the authenticated one. Authentication is paid once per
// connection; a message costs the same afterwards.
func measureBus(ctx context.Context, openURL, dir string, cred credentials) ([]BusCost, error) {
	ns, keys, err := node.StartSecureEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: filepath.Join(dir, "bus")})
	if err != nil {
		return nil, err
	}
	defer ns.Shutdown()
	gate, err := node.StartGate("", keys, discardLogger(), nats.InProcessServer(ns))
	if err != nil {
		return nil, err
	}
	defer gate.Close()
	worker := busauth.CredentialsOption(node.CredsPath(filepath.Join(dir, "bus"), busauth.RoleWorker))
	// The round trip is a control request: the control service's role
	// serves tool.svc.>.
	control := busauth.CredentialsOption(node.CredsPath(filepath.Join(dir, "bus"), busauth.RoleControl))
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	n, err := node.Open(runCtx, "", "bench", topology.TopologyOptions{}, discardLogger(), nats.InProcessServer(ns), worker)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	if err := gate.Attach(runCtx, cred.verifier, n); err != nil {
		return nil, err
	}
	authURL := ns.ClientURL()

	connect := func(url string, opts ...nats.Option) (Cost, error) {
		c := Cost{Samples: make([]time.Duration, 0, busConnects)}
		for i := range busConnects + warmup/10 {
			start := time.Now()
			nc, err := nats.Connect(url, opts...)
			if err != nil {
				return c, err
			}
			d := time.Since(start)
			nc.Close()
			if i >= warmup/10 {
				c.Samples = append(c.Samples, d)
			}
		}
		slices.Sort(c.Samples)
		return c, nil
	}
	roundTrip := func(url string, opts ...nats.Option) (Cost, error) {
		c := Cost{Samples: make([]time.Duration, 0, busRequests)}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			return c, err
		}
		defer nc.Close()
		sub, err := nc.Subscribe("tool.svc.bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
		if err != nil {
			return c, err
		}
		defer sub.Unsubscribe()
		for i := range busRequests + warmup {
			start := time.Now()
			if _, err := nc.Request("tool.svc.bench.echo", []byte("{}"), time.Second); err != nil {
				return c, err
			}
			if i >= warmup {
				c.Samples = append(c.Samples, time.Since(start))
			}
		}
		slices.Sort(c.Samples)
		return c, nil
	}
	var out []BusCost
	for _, m := range []struct {
		name      string
		fn        func(string, ...nats.Option) (Cost, error)
		openOpts  []nats.Option
		authnOpts []nats.Option
	}{
		{"connect, worker credentials", connect, nil, []nats.Option{worker}},
		{"connect, agent token", connect, nil, []nats.Option{nats.Token(cred.token)}},
		{"request-reply round trip", roundTrip, nil, []nats.Option{control}},
	} {
		open, err := m.fn(openURL, m.openOpts...)
		if err != nil {
			return out, fmt.Errorf("%s (open): %w", m.name, err)
		}
		authn, err := m.fn(authURL, m.authnOpts...)
		if err != nil {
			return out, fmt.Errorf("%s (authenticated): %w", m.name, err)
		}
		out = append(out, BusCost{Name: m.name, Open: open, Authn: authn})
	}
	return out, nil
}

func printBus(w io.Writer, costs []BusCost) {
	fmt.Fprintf(w, "\nbus authentication (open server / authenticated with the auth callout):\n")
	fmt.Fprintf(w, "%-30s %10s %10s %10s %10s %10s\n", "operation", "open p50", "authn p50", "open p99", "authn p99", "added p50")
	for _, c := range costs {
		fmt.Fprintf(w, "%-30s %10s %10s %10s %10s %10s\n", c.Name, us(c.Open.quantile(0.5)), us(c.Authn.quantile(0.5)),
			us(c.Open.quantile(0.99)), us(c.Authn.quantile(0.99)), us(c.Authn.quantile(0.5)-c.Open.quantile(0.5)))
	}
}
