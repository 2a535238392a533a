package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
)

const (
	busConnects = 200
	busRequests = 5000
)

// BusCost compares one operation on an open server, on serve's embedded
// server (clients authenticated in-process) and on a server whose clients
// go through the auth callout, as external servers and clusters do.
type BusCost struct {
	Name                   string
	Open, InProcess, Authn Cost
}

// measureBus times connecting (TCP, CONNECT and the authentication) and a
// core request-reply round trip on an open server beside the two
// authenticated ones. Authentication is paid once per connection; a
// message costs the same afterwards.
func measureBus(ctx context.Context, openURL, dir string, cred credentials) ([]BusCost, error) {
	inDir, coDir := filepath.Join(dir, "bus"), filepath.Join(dir, "bus-callout")
	ins, igate, err := node.StartSecureEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: inDir}, discardLogger())
	if err != nil {
		return nil, err
	}
	defer ins.Shutdown()
	cns, cgate, err := startCalloutServer(coDir)
	if err != nil {
		return nil, err
	}
	defer cns.Shutdown()
	defer cgate.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	for _, s := range []struct {
		ns   *server.Server
		gate *node.Gate
		dir  string
	}{{ins, igate, inDir}, {cns, cgate, coDir}} {
		n, err := node.Open(runCtx, "", "bench", topology.TopologyOptions{}, discardLogger(), nats.InProcessServer(s.ns),
			busauth.CredentialsOption(node.CredsPath(s.dir, busauth.RoleOperator)))
		if err != nil {
			return nil, err
		}
		defer n.Close()
		if err := s.gate.Attach(runCtx, cred.verifier, n); err != nil {
			return nil, err
		}
	}

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
	// The round trip is a control request: the control service's role
	// serves tool.svc.>.
	creds := func(dir string, role busauth.Role) nats.Option {
		return busauth.CredentialsOption(node.CredsPath(dir, role))
	}
	var out []BusCost
	for _, m := range []struct {
		name string
		fn   func(string, ...nats.Option) (Cost, error)
		opts func(dir string) []nats.Option
	}{
		{"connect, stage credentials", connect, func(d string) []nats.Option { return []nats.Option{creds(d, busauth.RoleExecute)} }},
		{"connect, agent token", connect, func(string) []nats.Option { return []nats.Option{nats.Token(cred.token)} }},
		{"request-reply round trip", roundTrip, func(d string) []nats.Option { return []nats.Option{creds(d, busauth.RoleOperator)} }},
	} {
		open, err := m.fn(openURL)
		if err != nil {
			return out, fmt.Errorf("%s (open): %w", m.name, err)
		}
		in, err := m.fn(ins.ClientURL(), m.opts(inDir)...)
		if err != nil {
			return out, fmt.Errorf("%s (in-process): %w", m.name, err)
		}
		co, err := m.fn(cns.ClientURL(), m.opts(coDir)...)
		if err != nil {
			return out, fmt.Errorf("%s (callout): %w", m.name, err)
		}
		out = append(out, BusCost{Name: m.name, Open: open, InProcess: in, Authn: co})
	}
	return out, nil
}

// startCalloutServer starts an embedded server configured as the external
// ones are (deploy/): its clients are authenticated by the auth callout.
func startCalloutServer(dir string) (*server.Server, *node.Gate, error) {
	// Like an external server, it has accounts for the declared tenants only.
	tenants := []string{benchTenant}
	if err := busauth.WriteTenants(dir, tenants); err != nil {
		return nil, nil, err
	}
	keys, err := busauth.WriteCredentials(dir)
	if err != nil {
		return nil, nil, err
	}
	o, err := busauth.EmbeddedOptions(keys, busauth.ServerSettings{Name: "callout", Port: -1, StoreDir: dir, Tenants: tenants})
	if err != nil {
		return nil, nil, err
	}
	o.NoLog = true
	ns, err := server.NewServer(o)
	if err != nil {
		return nil, nil, err
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, nil, fmt.Errorf("callout server did not start")
	}
	gate, err := node.StartGate("", keys, tenants, discardLogger(), nats.InProcessServer(ns))
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	return ns, gate, nil
}

func printBus(w io.Writer, costs []BusCost) {
	fmt.Fprintf(w, "\nbus authentication, p50 (p99): open server, embedded server (in-process), external server (auth callout):\n")
	fmt.Fprintf(w, "%-30s %18s %18s %18s %12s %12s\n", "operation", "open", "in-process", "callout", "added in-proc", "added callout")
	pp := func(c Cost) string { return us(c.quantile(0.5)) + " (" + us(c.quantile(0.99)) + ")" }
	for _, c := range costs {
		fmt.Fprintf(w, "%-30s %18s %18s %18s %12s %12s\n", c.Name, pp(c.Open), pp(c.InProcess), pp(c.Authn),
			us(c.InProcess.quantile(0.5)-c.Open.quantile(0.5)), us(c.Authn.quantile(0.5)-c.Open.quantile(0.5)))
	}
	fmt.Fprintf(w, "goal: authentication adds at most 1 ms to a connect and nothing per message\n")
}
