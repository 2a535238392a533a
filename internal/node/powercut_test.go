package node_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestPowerCut: what an embedded server's store holds after a power cut,
// with and without `serve --sync always`. The store's files are copied
// while publishers keep the invoke stream busy: what the copy holds is what
// the server had written out (the crash-consistent image a power cut
// leaves when the page cache made it to disk; writes the server kept in its
// own buffers are not in it). A server started on the copy must hold every
// publish acknowledged before the copy began when every write is fsynced;
// without, the test reports what was lost.
func TestPowerCut(t *testing.T) {
	for _, always := range []bool{true, false} {
		t.Run(fmt.Sprintf("sync always %v", always), func(t *testing.T) {
			acked, lost := powerCut(t, always)
			t.Logf("sync always %v: %d of %d acknowledged publishes lost", always, lost, acked)
			if always && lost > 0 {
				t.Fatalf("%d of %d acknowledged publishes lost with every write fsynced", lost, acked)
			}
		})
	}
}

// powerCut loads a server for a moment, copies its store mid-load, and
// counts the publishes acknowledged before the copy that a server started
// on the copy does not have.
func powerCut(t *testing.T, always bool) (acked, lost int) {
	dir := t.TempDir()
	ns, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir, SyncAlways: always})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}

	// Publishers record each acknowledged sequence.
	var mu sync.Mutex
	var seqs []uint64
	var stop atomic.Bool
	var load sync.WaitGroup
	body := make([]byte, 512)
	for w := range 4 {
		load.Go(func() {
			for i := 0; !stop.Load(); i++ {
				f, err := js.PublishAsync(subjects.Invoke(fmt.Sprintf("t%d", w)), body, jetstream.WithStallWait(5*time.Second))
				if err != nil {
					continue
				}
				go func() {
					select {
					case ack := <-f.Ok():
						mu.Lock()
						seqs = append(seqs, ack.Sequence)
						mu.Unlock()
					case <-f.Err():
					}
				}()
			}
		})
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seqs) }
	eventually(t, 10*time.Second, "publishes under way", func() bool { return count() >= 2000 })
	mu.Lock()
	before := append([]uint64(nil), seqs...)
	mu.Unlock()
	image := t.TempDir()
	if err := copyStore(dir, image); err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	load.Wait()
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()

	restarted, err := node.StartEmbedded(node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: image})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { restarted.Shutdown(); restarted.WaitForShutdown() }()
	nc2, err := nats.Connect(restarted.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	stream, err := js2.Stream(ctx, subjects.StreamInvoke)
	if err != nil {
		t.Fatalf("the invoke stream did not survive: %v", err)
	}
	for _, seq := range before {
		_, err := stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			lost++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	return len(before), lost
}

// copyStore copies the files under src to dst as they are now, file by
// file, while the server keeps writing; a file removed meanwhile is skipped.
func copyStore(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		in, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(to)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
