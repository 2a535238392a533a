package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// A networked sandbox gets a network namespace of its own, with only
// loopback, so nothing of the host's network (its loopback listeners above
// all: NATS, metrics) is reachable. Its one way out is an HTTP CONNECT proxy
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

// proxy serves one run's egress on a Unix socket.
type proxy struct {
	ln   net.Listener
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	eg   *Egress
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc
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
	p := &proxy{ln: ln, eg: eg, dial: cfg.EgressDial}
	if p.dial == nil {
		p.dial = publicDial
	}
	p.ctx, p.stop = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *proxy) close() {
	p.stop()
	p.ln.Close()
	p.wg.Wait()
}

func (p *proxy) serve() {
	defer p.wg.Done()
	var conns sync.WaitGroup
	defer conns.Wait()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		conns.Add(1)
		go func() {
			defer conns.Done()
			p.handle(c)
		}()
	}
}

// handle answers one CONNECT host:port: 403 for a host the run may not
// reach, 502 when the dial fails, else 200 and a tunnel.
func (p *proxy) handle(c net.Conn) {
	defer c.Close()
	go func() { <-p.ctx.Done(); c.Close() }()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	reply := func(code int) {
		fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\n\r\n", code, http.StatusText(code))
	}
	if req.Method != http.MethodConnect {
		reply(http.StatusMethodNotAllowed)
		return
	}
	host, portStr, err := net.SplitHostPort(req.Host)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || p.eg.Allow == nil || !p.eg.Allow(host, port) {
		reply(http.StatusForbidden)
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	up, err := p.dial(ctx, "tcp", net.JoinHostPort(host, portStr))
	cancel()
	if err != nil {
		reply(http.StatusBadGateway)
		return
	}
	reply(http.StatusOK)
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
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
