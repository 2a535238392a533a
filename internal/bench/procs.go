package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// stageProcs are `toolgate stage` processes started by the bench, each
// with its own metrics address for /readyz.
type stageProcs struct {
	procs []*exec.Cmd
	addrs []string
	done  []chan struct{}
}

// startStageProcs starts one `toolgate stage NAME` process of bin per entry
// of stages against url, with workers workers each, verifying capability
// tokens with cred's key, and waits until every one reports ready. Stop
// them with stop. They keep the defaults the bench's own stages run with
// (sandbox, file root), so the cluster's recorded security settings agree.
func startStageProcs(ctx context.Context, bin, url, dir string, stages []string, workers int, cred credentials) (*stageProcs, error) {
	jwks, err := cred.key.PublicJWKS()
	if err != nil {
		return nil, err
	}
	keys := filepath.Join(dir, "bench-jwks.json")
	if err := os.WriteFile(keys, jwks, 0o600); err != nil {
		return nil, err
	}
	p := &stageProcs{}
	for _, st := range stages {
		addr, err := freeAddr()
		if err != nil {
			p.stop()
			return nil, err
		}
		cmd := exec.Command(bin, "stage", st, "--nats", url, "--workers", fmt.Sprint(workers),
			"--jwks", keys, "--token-issuer", benchIssuer, "--token-audience", benchAudience,
			"--metrics-addr", addr, "--log-level", "error")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			p.stop()
			return nil, fmt.Errorf("starting %s stage process: %w", st, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		p.procs, p.addrs, p.done = append(p.procs, cmd), append(p.addrs, addr), append(p.done, done)
	}
	deadline := time.Now().Add(time.Minute)
	for i, addr := range p.addrs {
		for !ready(addr) {
			select {
			case <-p.done[i]:
				p.stop()
				return nil, fmt.Errorf("%s stage process exited before it was ready", stages[i])
			case <-ctx.Done():
				p.stop()
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				p.stop()
				return nil, errors.New("stage processes not ready within a minute")
			}
		}
	}
	return p, nil
}

// stop ends the processes as `toolgate stage` is meant to be stopped
// (SIGTERM: drain, then exit), killing any still running after 10 s.
func (p *stageProcs) stop() {
	for _, c := range p.procs {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for i, c := range p.procs {
		select {
		case <-p.done[i]:
		case <-time.After(10 * time.Second):
			_ = c.Process.Kill()
			<-p.done[i]
		}
	}
}

func ready(addr string) bool {
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// freeAddr is a loopback address nobody listens on right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
