package sandbox

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestEgressOnlyThroughProxy: a networked run has its own network: it cannot
// reach a loopback listener of the host, directly or through the proxy, nor
// a host outside its allowlist, and reaches an allowed host name through the
// proxy (mapped by the proxy's dialer to a local test server).
func TestEgressOnlyThroughProxy(t *testing.T) {
	cfg := requireSandbox(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"reached":"api.example.test"}`)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	_, hostPort, _ := net.SplitHostPort(host)
	cfg.EgressDial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "api.example.test:80" {
			return nil, fmt.Errorf("no such host %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, host)
	}
	eg := &Egress{Allow: func(h string, port int) bool { return h == "api.example.test" && port == 80 }}
	run := func(script string) (Result, error) {
		return Run(context.Background(), cfg, Spec{Argv: []string{"sh", "-c", script}, Network: true, Egress: eg,
			Limits: Limits{Wall: 15 * time.Second}})
	}
	for _, script := range []string{
		`curl -sS -f --max-time 5 -p http://api.example.test/`, // CONNECT tunnel
		`curl -sS -f --max-time 5 http://api.example.test/`,    // plain request through HTTP_PROXY
	} {
		res, err := run(script)
		if err != nil || strings.TrimSpace(string(res.Stdout)) != `{"reached":"api.example.test"}` {
			t.Fatalf("allowed host through the proxy (%s): %v %s %s", script, err, res.Stdout, res.Stderr)
		}
		// The proxy counted the exchange: at least the request line out,
		// the response with its 30-byte body in.
		if res.NetOut < int64(len("GET / HTTP/1.1\r\n")) || res.NetIn < 30 {
			t.Fatalf("%s: network bytes in %d, out %d", script, res.NetIn, res.NetOut)
		}
	}
	for name, script := range map[string]string{
		"host loopback directly":          `curl -sS --max-time 3 --noproxy '*' http://127.0.0.1:` + hostPort + `/`,
		"host loopback by /dev/tcp":       `bash -c 'exec 3<>/dev/tcp/127.0.0.1/` + hostPort + `'`,
		"host loopback by the proxy":      `curl -sS --max-time 3 -p http://127.0.0.1:` + hostPort + `/`,
		"a host not allowed":              `curl -sS --max-time 3 -p http://evil.example.test/`,
		"plain, not allowed":              `curl -sS -f --max-time 3 http://evil.example.test/`,
		"plain, allowed host, other port": `curl -sS -f --max-time 3 http://api.example.test:8080/`,
		"plain, host loopback":            `curl -sS -f --max-time 3 http://127.0.0.1:` + hostPort + `/`,
	} {
		t.Run(name, func(t *testing.T) {
			res, err := run(script + ` && echo '{"reached":true}'`)
			if err == nil || strings.Contains(string(res.Stdout), "reached") {
				t.Fatalf("%s: reached: %v %s", script, err, res.Stdout)
			}
		})
	}
}
