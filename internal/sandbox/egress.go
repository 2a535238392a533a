package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A networked sandbox gets a network namespace of its own, with only
// loopback, so nothing of the host's network (its loopback listeners above
// all: NATS, metrics) is reachable. Its one way out is an HTTP proxy
// the worker serves on a Unix socket bound into the sandbox, which admits
// only the hosts the run is allowed (Egress.Allow). Inside, a forwarder
// listening on 127.0.0.1:ProxyPort copies connections to that socket and
// runs the tool as its child, with HTTPS_PROXY and HTTP_PROXY pointing at it.
// The forwarder is the running executable itself, started in a hidden mode
// (ForwarderMain): a program calling ForwarderMain first thing is all it needs.

// Egress is a networked run's way out.
type Egress struct {
	// Allow reports whether the run may reach host:port.
	Allow func(host string, port int) bool
}

// ProxyPort is where a networked tool finds its proxy, on its own loopback.
const ProxyPort = 3128

const (
	forwarderEnv  = "TOOLGATE_EGRESS_FORWARD"
	egressSocket  = "/run/toolgate/egress.sock"
	forwarderPath = "/run/toolgate/forward"
)

// ForwarderMain runs the in-sandbox forwarder and exits when the process
// was started as one; otherwise it returns at once. Call it first in main
// (and in TestMain of tests that run networked tools).
func ForwarderMain() {
	if os.Getenv(forwarderEnv) == "" {
		return
	}
	os.Exit(forward(os.Args[1:]))
}

func forward(argv []string) int {
	if len(argv) == 0 {
		return 125
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ProxyPort))
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolgate egress forwarder:", err)
		return 125
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				u, err := net.Dial("unix", egressSocket)
				if err != nil {
					c.Close()
					return
				}
				splice(c, u)
			}()
		}
	}()
	_ = os.Unsetenv(forwarderEnv)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	default:
		fmt.Fprintln(os.Stderr, "toolgate egress forwarder:", err)
		return 127
	}
}

// splice copies both ways until either side is done.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}

// forwarderBinary is a copy of the running executable in a directory every
// run's uid can reach (the executable's own may be private, as `go test`'s
// build directory is).
var forwarderBinary = sync.OnceValues(func() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "toolgate-forwarder-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	src, err := os.Open(exe)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst := filepath.Join(dir, "toolgate")
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return "", err
	}
	return dst, out.Close()
})

// proxy serves one run's egress on a Unix socket: CONNECT tunnels (what
// HTTPS and `curl -p` use) and plain-HTTP requests in absolute form (what
// clients send through HTTP_PROXY for http:// URLs), both to allowed hosts
// only and both dialled with the same address checks.
type proxy struct {
	ln    net.Listener
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	eg    *Egress
	srv   *http.Server
	plain *httputil.ReverseProxy
	done  chan struct{}
	// Tunnels are hijacked, so the server no longer tracks them: closing
	// ends them and tunnels waits for them.
	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	tunnels sync.WaitGroup
	once    sync.Once
	// in and out count the bytes read from and written to the hosts
	// dialled.
	in, out atomic.Int64
}

// counted counts the bytes through a connection to a host.
type counted struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *counted) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *counted) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// startProxy listens on sock (made reachable to uid when not 0).
func startProxy(cfg Config, eg *Egress, sock string, uid uint32) (*proxy, error) {
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	if uid != 0 {
		if err := os.Chown(sock, int(uid), int(uid)); err != nil {
			ln.Close()
			return nil, err
		}
	}
	p := &proxy{ln: ln, eg: eg, dial: cfg.EgressDial, done: make(chan struct{}), closing: make(chan struct{})}
	if p.dial == nil {
		p.dial = publicDial
	}
	dial := p.dial
	p.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &counted{Conn: c, in: &p.in, out: &p.out}, nil
	}
	p.plain = &httputil.ReverseProxy{
		// The request already names its target; only hop-by-hop headers
		// (which ReverseProxy drops) and the proxy's own go.
		Rewrite: func(r *httputil.ProxyRequest) { r.Out.URL = r.In.URL },
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           p.dial,
			ResponseHeaderTimeout: 30 * time.Second,
			DisableKeepAlives:     true,
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 30 * time.Second}
	go func() {
		defer close(p.done)
		_ = p.srv.Serve(ln)
	}()
	return p, nil
}

// close stops the proxy and every connection it holds, tunnels included;
// later calls do nothing.
func (p *proxy) close() {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.closing)
		_ = p.srv.Close()
		<-p.done
		p.tunnels.Wait()
	})
}

// ServeHTTP answers 403 for a host the run may not reach, 502 when the dial
// fails, else tunnels (CONNECT) or forwards (absolute-form http:// request).
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		http.Error(w, "only CONNECT and absolute http:// requests", http.StatusMethodNotAllowed)
		return
	}
	host, port := r.URL.Hostname(), 80
	if s := r.URL.Port(); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			http.Error(w, "bad port", http.StatusBadRequest)
			return
		}
		port = n
	}
	if p.eg.Allow == nil || !p.eg.Allow(host, port) {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	r.URL.Host = net.JoinHostPort(host, strconv.Itoa(port))
	p.plain.ServeHTTP(w, r)
}

func (p *proxy) tunnel(w http.ResponseWriter, r *http.Request) {
	host, portStr, err := net.SplitHostPort(r.Host)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || p.eg.Allow == nil || !p.eg.Allow(host, port) {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	up, err := p.dial(ctx, "tcp", net.JoinHostPort(host, portStr))
	cancel()
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.tunnels.Add(1)
	p.mu.Unlock()
	defer p.tunnels.Done()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-p.closing:
			c.Close()
			up.Close()
		case <-stop:
		}
	}()
	_, _ = fmt.Fprintf(c, "HTTP/1.1 200 %s\r\n\r\n", http.StatusText(http.StatusOK))
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		_, _ = up.Write(b)
	}
	splice(c, up)
}

// publicDial dials addr, refusing loopback, private, link-local and
// unspecified addresses whatever name leads to them, so an allowed name
// cannot be pointed at the worker's own services.
func publicDial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
			return fmt.Errorf("egress to %s refused: not a public address", host)
		}
		return nil
	}}
	return d.DialContext(ctx, network, addr)
}
