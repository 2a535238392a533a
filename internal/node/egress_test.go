package node_test

import (
	"context"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestCLINetworkOnlyThroughEgressProxy: a cli tool granted only
// api.example.test:80 gets a network of its own: it cannot reach the NATS
// port on the host's loopback, nor another host through the proxy, and it
// reaches the granted host through the proxy (which the test maps to a
// local server, so nothing leaves the machine).
func TestCLINetworkOnlyThroughEgressProxy(t *testing.T) {
	if err := sandbox.Available(); err != nil {
		t.Fatalf("this test needs bubblewrap and prlimit: %v", err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"reached":"api"}`)
	}))
	defer srv.Close()
	target := strings.TrimPrefix(srv.URL, "http://")
	e := newEnv(t, topology.TopologyOptions{})
	cfg := node.Config{}
	cfg.Stage.Sandbox.FileRoot = t.TempDir()
	cfg.Stage.Sandbox.EgressDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "api.example.test:80" {
			return nil, fmt.Errorf("no such host %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, target)
	}
	n := e.startPipeline(cfg)
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	net := `{"network":[{"host":"api.example.test","port":80}]}`
	registerTools(t, n,
		cliTool("test.net_api", `curl -sS --max-time 5 -p http://api.example.test/`, "", net),
		cliTool("test.net_nats", `bash -c 'exec 3<>/dev/tcp/127.0.0.1/`+u.Port()+`' && echo '{"reached":"nats"}'`, "", net),
		cliTool("test.net_other", `curl -sS --max-time 5 -p http://other.example.test/`, "", net),
	)
	const tenant = "egress"
	c := grant(tenant, "test.*")
	c.Network = &token.NetworkGrant{AllowedHosts: []string{"api.example.test"}, AllowedPorts: []int{80}}
	raw := mint(t, c)
	call := func(id string) api.Response {
		return e.invoke(withTok(request(tenant, id, `{"arg":""}`), raw))
	}
	if resp := call("test.net_api"); resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), `"api"`) {
		t.Fatalf("the granted host: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	for _, id := range []string{"test.net_nats", "test.net_other"} {
		if resp := call(id); resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != api.EToolFailed {
			t.Fatalf("%s: %s %s %s", id, resp.Status, resp.Result, mustJSON(t, resp.Error))
		}
	}
}
