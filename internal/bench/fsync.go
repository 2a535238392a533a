package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/node"
)

// SyncCost is the JetStream publish rate of one server with the store's
// default sync interval or with an fsync before every acknowledgement
// (sync_interval: always, docs/operations.md).
type SyncCost struct {
	Mode                 string
	OneAtATime, InFlight float64 // publishes per second
}

// syncPublishes is how many 1 KiB publishes each series makes.
const syncPublishes = 2000

// measureSync publishes syncPublishes 1 KiB messages one at a time and then
// 64 in flight to a fresh embedded server (file storage in dir), once with
// the default sync interval and once fsyncing every write.
func measureSync(ctx context.Context, dir string) ([]SyncCost, error) {
	var out []SyncCost
	for _, always := range []bool{false, true} {
		mode := "default (2 min)"
		if always {
			mode = "always"
		}
		c, err := syncSeries(ctx, filepath.Join(dir, "sync-"+fmt.Sprint(always)), always)
		if err != nil {
			return out, fmt.Errorf("sync %s: %w", mode, err)
		}
		c.Mode = mode
		out = append(out, c)
	}
	return out, nil
}

func syncSeries(ctx context.Context, dir string, always bool) (SyncCost, error) {
	var c SyncCost
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir, SyncAlways: always})
	if err != nil {
		return c, err
	}
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return c, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return c, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYNC", Subjects: []string{"sync.>"}, Storage: jetstream.FileStorage}); err != nil {
		return c, err
	}
	body := make([]byte, 1024)
	start := time.Now()
	for i := range syncPublishes {
		if _, err := js.Publish(ctx, fmt.Sprintf("sync.%d", i%8), body); err != nil {
			return c, err
		}
	}
	c.OneAtATime = syncPublishes / time.Since(start).Seconds()
	start = time.Now()
	for i := range syncPublishes {
		if _, err := js.PublishAsync(fmt.Sprintf("sync.%d", i%8), body, jetstream.WithStallWait(time.Minute)); err != nil {
			return c, err
		}
		if i%64 == 63 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				return c, fmt.Errorf("publishes not acknowledged within a minute")
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		return c, fmt.Errorf("publishes not acknowledged within a minute")
	}
	c.InFlight = syncPublishes / time.Since(start).Seconds()
	return c, nil
}

// printSync writes the two modes and the cost of fsyncing.
func printSync(w io.Writer, cs []SyncCost) {
	if len(cs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nJetStream store sync, %d 1 KiB publishes (file storage; sync_interval: always is the shipped configuration's):\n", syncPublishes)
	fmt.Fprintf(w, "%-20s %16s %16s\n", "sync_interval", "one at a time", "64 in flight")
	for _, c := range cs {
		fmt.Fprintf(w, "%-20s %14.0f/s %14.0f/s\n", c.Mode, c.OneAtATime, c.InFlight)
	}
	if len(cs) == 2 && cs[1].OneAtATime > 0 && cs[1].InFlight > 0 {
		fmt.Fprintf(w, "%-20s %15.1fx %15.1fx\n", "cost of always", cs[0].OneAtATime/cs[1].OneAtATime, cs[0].InFlight/cs[1].InFlight)
	}
}
