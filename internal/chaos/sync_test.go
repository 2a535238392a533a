package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestSyncIntervalCost measures what `sync_interval: always` (fsync every
// write) costs an external server with file storage: acknowledged publishes
// per second, one at a time and with 64 in flight, against the default
// (fsync every 2 minutes). It prints figures for docs/operations.md and runs
// in make chaos only.
func TestSyncIntervalCost(t *testing.T) {
	if testing.Short() || os.Getenv("TOOLGATE_CHAOS_CLUSTER") == "" {
		t.Skip("make chaos: set TOOLGATE_CHAOS_CLUSTER=1")
	}
	binaries(t)
	for _, always := range []bool{false, true} {
		dir := t.TempDir()
		s := newServer(t, dir, serverOpts{Name: "sync", Port: freePort(t), HTTPPort: freePort(t),
			StoreDir: filepath.Join(dir, "jetstream"), SyncAlways: always})
		s.start()
		s.waitHealthy(30 * time.Second)
		nc, err := nats.Connect(s.url())
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		ctx := t.Context()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}}); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, 1024)
		const n = 2000
		start := time.Now()
		for i := range n {
			if _, err := js.Publish(ctx, fmt.Sprintf("s.%d", i%8), body); err != nil {
				t.Fatal(err)
			}
		}
		seq := float64(n) / time.Since(start).Seconds()
		start = time.Now()
		for i := range n {
			if _, err := js.PublishAsync(fmt.Sprintf("s.%d", i%8), body, jetstream.WithStallWait(time.Minute)); err != nil {
				t.Fatal(err)
			}
			if i%64 == 63 {
				select {
				case <-js.PublishAsyncComplete():
				case <-time.After(time.Minute):
					t.Fatal("async publishes not acknowledged")
				}
			}
		}
		<-js.PublishAsyncComplete()
		par := float64(n) / time.Since(start).Seconds()
		mode := "default (2m)"
		if always {
			mode = "always"
		}
		fmt.Printf("chaos sync_interval %-12s 1 KiB publishes: %6.0f/s one at a time, %6.0f/s 64 in flight\n", mode, seq, par)
		nc.Close()
		s.kill()
	}
}
