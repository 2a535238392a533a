package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// cluster is three nats-server processes on loopback whose routes run
// through one TCP proxy per ordered pair of nodes, so a node can be cut off.
type cluster struct {
	t       *testing.T
	nodes   []*server
	proxies [3][3]*proxy // proxies[i][j]: node i's route to node j
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	binaries(t)
	dir := t.TempDir()
	c := &cluster{t: t}
	var routePorts [3]int
	for i := range routePorts {
		routePorts[i] = freePort(t)
	}
	for i := range 3 {
		for j := range 3 {
			if i != j {
				c.proxies[i][j] = newProxy(t, fmt.Sprintf("127.0.0.1:%d", routePorts[j]))
			}
		}
	}
	for i := range 3 {
		var routes []string
		for j := range 3 {
			if i != j {
				routes = append(routes, "nats-route://"+c.proxies[i][j].addr())
			}
		}
		c.nodes = append(c.nodes, newServer(t, dir, serverOpts{
			Name: fmt.Sprintf("n%d", i+1), Port: freePort(t), HTTPPort: freePort(t),
			StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			Cluster:  "chaos", RoutePort: routePorts[i], Routes: routes,
		}))
	}
	for _, n := range c.nodes {
		n.start()
	}
	for _, n := range c.nodes {
		n.waitHealthy(time.Minute)
	}
	return c
}

func (c *cluster) urls() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.url())
	}
	return out
}

func (c *cluster) byName(name string) *server {
	for _, n := range c.nodes {
		if n.o.Name == name {
			return n
		}
	}
	return nil
}

// metaLeader asks a healthy node's /jsz for the meta leader.
func (c *cluster) metaLeader() *server {
	for _, n := range c.nodes {
		resp, err := (&http.Client{Timeout: time.Second}).Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", n.o.HTTPPort))
		if err != nil {
			continue
		}
		var jsz struct {
			Meta struct {
				Leader string `json:"leader"`
			} `json:"meta_cluster"`
		}
		err = json.NewDecoder(resp.Body).Decode(&jsz)
		resp.Body.Close()
		if err == nil && jsz.Meta.Leader != "" {
			return c.byName(jsz.Meta.Leader)
		}
	}
	return nil
}

// streamLeader is the node leading stream.
func (c *cluster) streamLeader(js jetstream.JetStream, stream string) *server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil || s.CachedInfo().Cluster == nil {
		return nil
	}
	return c.byName(s.CachedInfo().Cluster.Leader)
}

// bounce SIGKILLs n, optionally wipes its store, starts it again and waits
// until every node reports healthy (JetStream current); it returns how long
// that took.
func (c *cluster) bounce(n *server, wipe bool) time.Duration {
	start := time.Now()
	n.kill()
	time.Sleep(2 * time.Second)
	if wipe {
		n.wipe()
	}
	n.start()
	for _, m := range c.nodes {
		m.waitHealthy(3 * time.Minute)
	}
	return time.Since(start)
}

// partition cuts n off from both peers for d, heals, and waits until every
// node is healthy again.
func (c *cluster) partition(n *server, d time.Duration) time.Duration {
	i := 0
	for k, m := range c.nodes {
		if m == n {
			i = k
		}
	}
	links := func(cut bool) {
		for j := range 3 {
			if j != i {
				c.proxies[i][j].setCut(cut)
				c.proxies[j][i].setCut(cut)
			}
		}
	}
	start := time.Now()
	links(true)
	time.Sleep(d)
	links(false)
	for _, m := range c.nodes {
		m.waitHealthy(3 * time.Minute)
	}
	return time.Since(start)
}

// TestChaosCluster runs invocations through two processes per stage
// against a three-node cluster (R3 streams, consumers and buckets) while, in
// turn: the meta leader, the leader of TOOLGATE_PIPELINE, the leader of
// AUDIT and the leader of TOOLGATE_INVOKE are SIGKILLed and restarted; a
// node is killed, its store wiped, and it rejoins; and a node is cut off
// from its peers for ten seconds. Only in make chaos (TOOLGATE_CHAOS_CLUSTER=1).
func TestChaosCluster(t *testing.T) {
	if testing.Short() || os.Getenv("TOOLGATE_CHAOS_CLUSTER") == "" {
		t.Skip("make chaos: set TOOLGATE_CHAOS_CLUSTER=1")
	}
	c := newCluster(t)
	h := newHarness(t, c.urls(), 3)
	h.setup()
	h.startAll(2)
	h.waitReady(2 * time.Minute)
	js, err := jetstream.New(h.conn())
	if err != nil {
		t.Fatal(err)
	}
	faults := []struct {
		name string
		do   func() time.Duration
	}{
		{"meta leader killed", func() time.Duration { return c.bounce(c.metaLeader(), false) }},
		{"pipeline leader killed", func() time.Duration { return c.bounce(c.streamLeader(js, subjects.StreamPipeline), false) }},
		{"audit leader killed", func() time.Duration { return c.bounce(c.streamLeader(js, subjects.StreamAudit), false) }},
		{"invoke leader killed", func() time.Duration { return c.bounce(c.streamLeader(js, subjects.StreamInvoke), false) }},
		{"store wiped", func() time.Duration { return c.bounce(c.nodes[1], true) }},
		{"partitioned", func() time.Duration { return c.partition(c.nodes[2], 10*time.Second) }},
	}
	next := 0
	l, n, recovery := during(func() *load { return h.drive(t.Context(), invocations(), 8, rate()) }, 5*time.Second, len(faults),
		func() time.Duration {
			f := faults[next%len(faults)]
			next++
			d := f.do()
			fmt.Printf("chaos cluster fault %q healed in %v\n", f.name, d.Round(time.Millisecond))
			return d
		})
	h.verify(l, "cluster", n, recovery, 10*time.Minute).check(t)
}
