package auditarchive_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/auditarchive"
	"github.com/toolgate/toolgate/internal/natstest"
)

// s3Server is a real S3-compatible server: versitygw on a posix directory
// (make s3-server builds it into .cache/bin), stopped and started again
// on the same port and directory as the tests' faults need.
type s3Server struct {
	t    *testing.T
	bin  string
	dir  string
	addr string
	cmd  *exec.Cmd
}

const s3Access, s3Secret = "toolgate-test", "toolgate-test-secret"

func versitygw(t *testing.T) string {
	if p := os.Getenv("TOOLGATE_VERSITYGW"); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", ".cache", "bin", "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	t.Skip("no versitygw (make s3-server): the S3 archive is tested against a real S3-compatible server")
	return ""
}

func startS3(t *testing.T) *s3Server {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &s3Server{t: t, bin: versitygw(t), dir: t.TempDir(), addr: addr}
	if err := os.MkdirAll(filepath.Join(s.dir, "audit-cold"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *s3Server) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, "--access", s3Access, "--secret", s3Secret, "--port", s.addr, "posix", s.dir)
	var out strings.Builder
	var mu sync.Mutex
	s.cmd.Stdout, s.cmd.Stderr = lockedWriter{&mu, &out}, lockedWriter{&mu, &out}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	natstest.Eventually(s.t, 30*time.Second, func() bool {
		r, err := http.Get("http://" + s.addr + "/")
		if err == nil {
			r.Body.Close()
		}
		return err == nil
	}, "versitygw to listen")
}

func (s *s3Server) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (s *s3Server) store(t *testing.T) *archivestore.S3 {
	t.Setenv("AWS_ACCESS_KEY_ID", s3Access)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3Secret)
	t.Setenv("AWS_REGION", "us-east-1")
	store, err := archivestore.Open(nil, "s3://audit-cold/toolgate?endpoint=http://"+s.addr)
	if err != nil {
		t.Fatal(err)
	}
	return store.(*archivestore.S3)
}

func TestArchiveToS3(t *testing.T) {
	srv := startS3(t)
	tr := newTrail(t)
	store := srv.store(t)
	tr.add(120, 40)
	a := tr.archiver(store)
	got, err := a.Once(tr.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[1-80 81-120]"; fmt.Sprint(names(got)) != want {
		t.Fatalf("archived %v, want %s", names(got), want)
	}
	// The listing shows the coverage, under the prefix, and the run's
	// head after it.
	objs, err := store.List(tr.ctx)
	if err != nil || len(objs) != 3 || !strings.HasPrefix(objs[2].Name, "HEAD-") || !strings.HasSuffix(objs[0].Name, "-00000000000000000001-00000000000000000080.jsonl") {
		t.Fatalf("listing: %+v %v", objs, err)
	}
	if _, err := os.Stat(filepath.Join(srv.dir, "audit-cold", "toolgate", objs[0].Name)); err != nil {
		t.Fatalf("not on the server's disk: %v", err)
	}
	rep, err := auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil || !rep.Intact() || rep.Events != 120 {
		t.Fatalf("archive: %+v %v", rep, err)
	}

	// An object altered on the server's disk is named.
	path := filepath.Join(srv.dir, "audit-cold", "toolgate", objs[1].Name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), `"kind":"checkpoint"`, `"kind":"checkpoint","x":1`, 1)+"{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err = auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil || rep.Intact() || !strings.Contains(findings(rep), "bad-object seq 81..120") {
		t.Fatalf("an altered object not named: %v\n%s", err, findings(rep))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The store down: the run fails, is told, and archives nothing; the
	// trail is as it was. Up again, the next run goes on where it stopped.
	tr.add(60, 40)
	srv.stop()
	var failures atomic.Int32
	a.Failed = func(context.Context, int, error) { failures.Add(1) }
	ctx, cancel := context.WithCancel(tr.ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx, 300*time.Millisecond) }()
	natstest.Eventually(t, 30*time.Second, func() bool { return failures.Load() >= 2 }, "two failed runs")
	cancel()
	<-done
	srv.start()
	got, err = a.Once(tr.ctx)
	if err != nil || fmt.Sprint(names(got)) != "[121-180]" {
		t.Fatalf("after the store came back: %v %v", names(got), err)
	}
	rep, err = auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil || !rep.Intact() || rep.Events != 180 || rep.Objects != 3 {
		t.Fatalf("archive: %+v %v\n%s", rep, err, findings(rep))
	}

	// The last object removed from the server's disk: its head names it.
	if err := os.Remove(filepath.Join(srv.dir, "audit-cold", "toolgate", got[0].Name)); err != nil {
		t.Fatal(err)
	}
	rep, err = auditarchive.VerifyArchive(tr.ctx, store, tr.pub)
	if err != nil || rep.Intact() || !strings.Contains(findings(rep), "archive-truncated seq 121..180") {
		t.Fatalf("the last object removed, not named: %v\n%s", err, findings(rep))
	}
}
