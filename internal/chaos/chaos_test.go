package chaos

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/toolgate/toolgate/subjects"
)

// rate is the offered load in invocations per second: TOOLGATE_CHAOS_RATE,
// else 100.
func rate() int {
	if n, err := strconv.Atoi(os.Getenv("TOOLGATE_CHAOS_RATE")); err == nil && n > 0 {
		return n
	}
	if invocations() <= 1000 {
		return 30 // the short variant: ten seconds of load
	}
	return 100
}

// serverEvery is how many faults make one server restart in the
// single-server scenario: TOOLGATE_CHAOS_SERVER_EVERY, else 5 (3 in the
// short variant, so that its ten seconds of load see a few).
func serverEvery() int {
	if n, err := strconv.Atoi(os.Getenv("TOOLGATE_CHAOS_SERVER_EVERY")); err == nil && n > 0 {
		return n
	}
	if invocations() <= 1000 {
		return 3
	}
	return 5
}

func singleServer(t *testing.T) *server {
	t.Helper()
	binaries(t)
	dir := t.TempDir()
	s := newServer(t, dir, serverOpts{Name: "n1", Port: freePort(t), HTTPPort: freePort(t), StoreDir: filepath.Join(dir, "jetstream")})
	s.start()
	s.waitHealthy(30 * time.Second)
	return s
}

// during runs fault every interval until the load ends or limit faults
// happened, and returns how many it caused and the longest recovery one
// reported.
func during(l func() *load, interval time.Duration, limit int, fault func() time.Duration) (*load, int, time.Duration) {
	done := make(chan *load)
	go func() { done <- l() }()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	n, worst := 0, time.Duration(0)
	for {
		select {
		case res := <-done:
			return res, n, worst
		case <-tick.C:
			if n >= limit {
				continue
			}
			worst = max(worst, fault())
			n++
		}
	}
}

// TestChaosSingleServer runs invocations through two processes per stage
// against one external nats-server (file storage) and meanwhile SIGKILLs a
// random stage process every second (three in make chaos), starting a
// replacement each time; every fifth fault (third in the short variant;
// TOOLGATE_CHAOS_SERVER_EVERY) instead SIGKILLs the server and starts it
// again on the same store.
func TestChaosSingleServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	begin := time.Now()
	s := singleServer(t)
	t.Logf("%v: server up", time.Since(begin))
	h := newHarness(t, []string{s.url()}, 1)
	h.setup()
	t.Logf("%v: topology and tools", time.Since(begin))
	// Two processes per stage in make chaos; one (two for execute) in the
	// short variant, which has two shared cores to itself at most.
	if invocations() > 1000 {
		h.startAll(2)
	} else {
		h.startAll(1)
		h.startWorker(subjects.Execute)
	}
	h.waitReady(time.Minute)
	t.Logf("%v: workers ready", time.Since(begin))
	interval := time.Second
	if invocations() > 1000 {
		interval = 3 * time.Second
	}
	n := 0
	l, faults, recovery := during(func() *load { return h.drive(t.Context(), invocations(), 8, rate()) }, interval, 1<<30,
		func() time.Duration {
			if n++; n%serverEvery() != 0 {
				h.killRandomWorker()
				return 0
			}
			start := time.Now()
			s.kill()
			time.Sleep(time.Second)
			s.start()
			s.waitHealthy(time.Minute)
			return time.Since(start)
		})
	t.Logf("%v: load published", time.Since(begin))
	h.verify(l, "single-server", faults, recovery, 5*time.Minute).check(t)
	t.Logf("%v: verified", time.Since(begin))
}
