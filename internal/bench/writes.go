package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// streamState is what the store's writes are counted from: one stream's
// storage, retention and sequence numbers at one moment.
type streamState struct {
	storage   jetstream.StorageType
	retention jetstream.RetentionPolicy
	lastSeq   uint64 // every stored message takes the next sequence
	msgs      uint64 // held now
}

// storeState is every stream of an account at one moment, by name.
type storeState map[string]streamState

// readStore lists the streams the connection's account holds, with their
// states: the JetStream API's stream list, as `nats stream ls` reads it.
func readStore(ctx context.Context, js jetstream.JetStream) (storeState, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st := storeState{}
	l := js.ListStreams(ctx)
	for si := range l.Info() {
		st[si.Config.Name] = streamState{storage: si.Config.Storage, retention: si.Config.Retention,
			lastSeq: si.State.LastSeq, msgs: si.State.Msgs}
	}
	return st, l.Err()
}

// streamWrites are the writes one stream's store made over a series.
type streamWrites struct {
	Stored  uint64 // messages stored (a key-value put is one)
	Deleted uint64 // messages removed by an acknowledgement
	Memory  bool   // the stream keeps its messages in memory
}

// storeWrites are the writes a series made, per stream.
type storeWrites map[string]streamWrites

// writesBetween are the writes between two readings of the store, of the
// streams named by include. nats-server's file store (filestore.go)
// writes one record per stored message and, for a message removed by an
// acknowledgement (a work-queue or interest stream), a delete tombstone;
// with sync_interval always each record is fsynced before the write is
// acknowledged. A message removed by the stream's limits (a key-value
// bucket's history of one, an age limit) costs no record.
func writesBetween(before, after storeState, include func(stream string) bool) storeWrites {
	w := storeWrites{}
	for name, a := range after {
		if !include(name) {
			continue
		}
		b := before[name] // a stream created since starts at zero
		if a.lastSeq < b.lastSeq {
			b = streamState{} // deleted and created again
		}
		stored := a.lastSeq - b.lastSeq
		var removed uint64
		if held := b.msgs + stored; held > a.msgs {
			removed = held - a.msgs
		}
		if a.retention == jetstream.LimitsPolicy {
			removed = 0
		}
		if stored > 0 || removed > 0 {
			w[name] = streamWrites{Stored: stored, Deleted: removed, Memory: a.storage == jetstream.MemoryStorage}
		}
	}
	return w
}

// writesPerCall are a series' store writes per call.
type writesPerCall struct {
	File    float64 // records written to file streams: stores and tombstones
	Deletes float64 // of which tombstones
	Memory  float64 // messages stored in memory streams
	// Streams are the file and memory writes per call of each stream
	// written to, largest first.
	Streams []streamPerCall
	// Fsyncs are the fsync and fdatasync calls the serve process made
	// per call, counted by perf; FsyncsCounted says whether they were.
	Fsyncs        float64
	FsyncsCounted bool
	// FsyncsDerived are the fsyncs per call the file store's rule gives: one
	// per record with sync always, none otherwise.
	FsyncsDerived float64
}

type streamPerCall struct {
	Name   string
	Memory bool
	Writes float64
}

// perCall divides w among calls; always says whether the store fsyncs
// every record.
func (w storeWrites) perCall(calls int, always bool) writesPerCall {
	var p writesPerCall
	if calls <= 0 {
		return p
	}
	n := float64(calls)
	for _, name := range slices.Sorted(maps.Keys(w)) {
		s := w[name]
		if s.Memory {
			p.Memory += float64(s.Stored) / n
			p.Streams = append(p.Streams, streamPerCall{Name: name, Memory: true, Writes: float64(s.Stored) / n})
			continue
		}
		p.File += float64(s.Stored+s.Deleted) / n
		p.Deletes += float64(s.Deleted) / n
		p.Streams = append(p.Streams, streamPerCall{Name: name, Writes: float64(s.Stored+s.Deleted) / n})
	}
	slices.SortStableFunc(p.Streams, func(a, b streamPerCall) int {
		switch {
		case a.Writes > b.Writes:
			return -1
		case a.Writes < b.Writes:
			return 1
		}
		return 0
	})
	if always {
		p.FsyncsDerived = p.File
	}
	return p
}

// streamsLine is the per-stream writes per call, file and memory.
func (p writesPerCall) streamsLine() string { return strings.Join(p.streams(), ", ") }

func (p writesPerCall) streams() []string {
	var each []string
	for _, s := range p.Streams {
		kind := "file"
		if s.Memory {
			kind = "memory"
		}
		each = append(each, fmt.Sprintf("%s %.2f (%s)", s.Name, s.Writes, kind))
	}
	return each
}

// writeCounter counts a series' writes on a server from the operator's
// connection, and with a pid the fsyncs of that process.
type writeCounter struct {
	js      jetstream.JetStream
	include func(stream string) bool
	pid     int
	always  bool
}

func newWriteCounter(nc *nats.Conn, pid int, always bool, include func(string) bool) (*writeCounter, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &writeCounter{js: js, include: include, pid: pid, always: always}, nil
}

// count runs series and returns its writes per call (series returns its
// calls); with fsyncs, perf counts the process's fsyncs meanwhile.
func (c *writeCounter) count(ctx context.Context, fsyncs bool, series func() (int, error)) (writesPerCall, error) {
	before, err := readStore(ctx, c.js)
	if err != nil {
		return writesPerCall{}, err
	}
	var sc *syscallCounter
	if fsyncs && c.pid > 0 {
		sc = startSyscallCounter(c.pid) // nil where perf cannot count
	}
	calls, err := series()
	var after storeState
	if err == nil {
		after, err = c.settled(ctx)
	}
	var synced float64
	var counted bool
	if sc != nil {
		synced, counted = sc.stop()
	}
	if err != nil {
		return writesPerCall{}, err
	}
	p := writesBetween(before, after, c.include).perCall(calls, c.always)
	if counted && calls > 0 {
		p.Fsyncs, p.FsyncsCounted = synced/float64(calls), true
	}
	return p, nil
}

// settled reads the store once the series' last writes are in: a call's
// result reaches its reader before the store has written (and with sync
// always fsynced) it and the acknowledgements behind it. Settled is two
// readings 250 ms apart that agree on the counted streams, or 5 s.
func (c *writeCounter) settled(ctx context.Context) (storeState, error) {
	sum := func(st storeState) (n uint64) {
		for name, s := range st {
			if c.include(name) {
				n += s.lastSeq + s.msgs
			}
		}
		return n
	}
	st, err := readStore(ctx, c.js)
	for deadline := time.Now().Add(5 * time.Second); err == nil && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		var next storeState
		if next, err = readStore(ctx, c.js); err == nil {
			done := sum(next) == sum(st)
			st = next
			if done {
				break
			}
		}
	}
	return st, err
}

// chainStream reports whether stream belongs to one of the bench's chains
// (their work-queue stream and the floor's key-value bucket).
func chainStream(stream string) bool { return strings.Contains(stream, "BENCH_RAW") }

// syncEvents are the system calls that flush a file to the disk: Go's
// File.Sync is fsync.
var syncEvents = []string{"syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync"}

// syscallCounter is `perf stat` counting a process's syncEvents.
type syscallCounter struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	exited chan struct{}
}

// startSyscallCounter attaches perf to pid's threads (and those they
// start); nil where perf is missing or may not count. perf opens its
// counters disabled and enables them on command, acknowledging once they
// count: a fixed wait instead undercounts where perf is slow to attach, on
// a loaded machine.
func startSyscallCounter(pid int) *syscallCounter {
	path, err := exec.LookPath("perf")
	if err != nil {
		return nil
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil
	}
	defer ctlW.Close()
	defer ackR.Close()
	// The child's fd 3 and 4 are ExtraFiles' first and second.
	args := []string{"stat", "-x", ",", "-p", strconv.Itoa(pid), "--delay=-1", "--control", "fd:3,4"}
	for _, e := range syncEvents {
		args = append(args, "-e", e)
	}
	c := &syscallCounter{cmd: exec.Command(path, args...), exited: make(chan struct{})}
	c.cmd.Stderr = &c.out
	c.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	err = c.cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		return nil
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	acked := make(chan bool, 1)
	go func() {
		line, err := bufio.NewReader(ackR).ReadString('\n')
		acked <- err == nil && strings.TrimSpace(line) == "ack"
	}()
	if _, err := ctlW.WriteString("enable\n"); err != nil {
		c.kill()
		return nil
	}
	select {
	case ok := <-acked:
		if ok {
			return c
		}
	case <-time.After(30 * time.Second):
	}
	c.kill() // refused, or never counting
	return nil
}

// kill ends perf without its counts.
func (c *syscallCounter) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// stop ends perf (SIGINT: it prints its counts) and returns the sum of
// the events counted, and whether perf counted them all.
func (c *syscallCounter) stop() (float64, bool) {
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.kill()
		return 0, false
	}
	n, err := parsePerfStat(c.out.String(), syncEvents)
	return n, err == nil
}

// parsePerfStat sums the counts `perf stat -x ,` printed for events: the
// first field is the count, the third the event's name. "<not counted>"
// stands where no thread ran while perf counted (no call, so none), "<not
// supported>" where the kernel cannot count the event.
func parsePerfStat(out string, events []string) (float64, error) {
	var sum float64
	seen := 0
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || !slices.Contains(events, f[2]) {
			continue
		}
		n, err := strconv.ParseFloat(f[0], 64)
		if f[0] == "<not counted>" {
			n, err = 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("perf did not count %s: %s", f[2], f[0])
		}
		sum += n
		seen++
	}
	if seen != len(events) {
		return 0, errors.New("perf printed no count: " + strings.TrimSpace(out))
	}
	return sum, nil
}
