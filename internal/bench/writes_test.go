package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestWritesCounted: a known series of writes to a file work-queue stream
// (some acknowledged, so removed), a memory stream and a file key-value
// bucket is counted per stream and storage from the server's stream
// states; with sync always, perf (where it can count) sees at least one
// fsync per record the file store wrote, tombstones among them, and with
// the default sync interval far fewer.
func TestWritesCounted(t *testing.T) {
	for _, always := range []bool{true, false} {
		t.Run(fmt.Sprintf("always=%v", always), func(t *testing.T) { writesCounted(t, always) })
	}
}

func writesCounted(t *testing.T, always bool) {
	nc := embeddedConn(t, always)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	wq, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WQ", Subjects: []string{"wq.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "MEM", Subjects: []string{"mem.>"},
		Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "REC", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := wq.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "w", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// A stream the counter is told to leave out.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	c, err := newWriteCounter(nc, os.Getpid(), always, func(s string) bool { return s != "OTHER" })
	if err != nil {
		t.Fatal(err)
	}
	const calls = 2
	got, err := c.count(ctx, true, func() (int, error) {
		for i := range 10 {
			if _, err := js.Publish(ctx, fmt.Sprintf("wq.%d", i), []byte("x")); err != nil {
				return 0, err
			}
		}
		// Eight of the ten acknowledged: each a tombstone in the file
		// store (the block keeps two, so it is not removed whole).
		batch, err := cons.Fetch(8, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return 0, err
		}
		acked := 0
		for m := range batch.Messages() {
			if err := m.DoubleAck(ctx); err != nil {
				return 0, err
			}
			acked++
		}
		if acked != 8 {
			return 0, fmt.Errorf("%d of 8 messages fetched", acked)
		}
		for i := range 5 {
			if _, err := js.Publish(ctx, fmt.Sprintf("mem.%d", i), []byte("x")); err != nil {
				return 0, err
			}
		}
		if _, err := js.Publish(ctx, "other.1", []byte("x")); err != nil {
			return 0, err
		}
		// A create and two updates of one key (the older revisions go by
		// the bucket's history limit, no tombstone) and a put of another.
		rev, err := kv.Create(ctx, "a", []byte("1"))
		if err != nil {
			return 0, err
		}
		for range 2 {
			if rev, err = kv.Update(ctx, "a", []byte("2"), rev); err != nil {
				return 0, err
			}
		}
		_, err = kv.Put(ctx, "b", []byte("1"))
		return calls, err
	})
	if err != nil {
		t.Fatal(err)
	}
	// File: 10 stored and 8 tombstones in WQ, 4 stored in KV_REC; memory:
	// 5 in MEM. Per call, half.
	if got.File != 11 || got.Deletes != 4 || got.Memory != 2.5 {
		t.Errorf("per call: file %.2f (of which deletes %.2f), memory %.2f; want 11, 4, 2.5", got.File, got.Deletes, got.Memory)
	}
	if line, want := got.streamsLine(), "WQ 9.00 (file), MEM 2.50 (memory), KV_REC 2.00 (file)"; line != want {
		t.Errorf("streams %q, want %q", line, want)
	}
	if want := map[bool]float64{true: 11, false: 0}[always]; got.FsyncsDerived != want {
		t.Errorf("derived fsyncs per call %.2f, want %.0f", got.FsyncsDerived, want)
	}
	t.Logf("per call: file %.2f, deletes %.2f, memory %.2f, fsyncs %.2f (counted %v)", got.File, got.Deletes, got.Memory, got.Fsyncs, got.FsyncsCounted)
	if _, err := exec.LookPath("perf"); err != nil || !got.FsyncsCounted {
		t.Logf("fsyncs not counted here (perf: %v)", err)
		return
	}
	// Beyond the records: the consumer's state file, written at most ten
	// times a second with a directory fsync each.
	if always && (got.Fsyncs < got.File || got.Fsyncs > got.File+5) {
		t.Errorf("%.2f fsyncs per call counted with sync always, want %.0f records' and a few more", got.Fsyncs, got.File)
	}
	if !always && got.Fsyncs >= 1 {
		t.Errorf("%.2f fsyncs per call counted with the default sync interval, want about none", got.Fsyncs)
	}
}

// TestParsePerfStat reads perf's CSV output, a thread that never ran
// counted as none, and refuses output without the counts.
func TestParsePerfStat(t *testing.T) {
	out := "12,,syscalls:sys_enter_fsync,100,100.00,,\n<not counted>,,syscalls:sys_enter_fdatasync,0,100.00,,\n"
	if n, err := parsePerfStat(out, syncEvents); err != nil || n != 12 {
		t.Errorf("parsed %v, %v; want 12", n, err)
	}
	for _, bad := range []string{"", "<not supported>,,syscalls:sys_enter_fsync,0,100.00,,\n3,,syscalls:sys_enter_fdatasync,1,100.00,,\n",
		"Error: No permissions\n"} {
		if n, err := parsePerfStat(bad, syncEvents); err == nil {
			t.Errorf("parsed %q as %v", bad, n)
		}
	}
}

// TestSyscallCounterCountsFromItsStart: where perf can count fsyncs here,
// the counter starts, and an fsync made the moment it returns is counted.
func TestSyscallCounterCountsFromItsStart(t *testing.T) {
	path, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("no perf here")
	}
	probe, err := exec.Command(path, "stat", "-x", ",", "-e", syncEvents[0], "true").CombinedOutput()
	if _, perr := parsePerfStat(string(probe), syncEvents[:1]); err != nil || perr != nil {
		t.Skipf("perf may not count %s here: %s", syncEvents[0], probe)
	}
	c := startSyscallCounter(os.Getpid())
	if c == nil {
		t.Fatal("perf counts here, but the counter did not start")
	}
	f, err := os.CreateTemp(t.TempDir(), "sync")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 3 {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	n, counted := c.stop()
	if !counted || n < 3 {
		t.Fatalf("%v fsyncs counted (counted %v), want at least the 3 made", n, counted)
	}
}
