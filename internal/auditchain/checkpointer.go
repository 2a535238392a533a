package auditchain

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// Defaults of Checkpointer. A checkpoint hashes each event, reading back
// those its Leaves do not hold; measured in docs/audit.md against the
// audit stage's own work.
const (
	DefaultEvery    = 1000
	DefaultInterval = 5 * time.Second
)

// Checkpointer writes the chain: run one in every audit process. Each
// checkpoint covers the events after the last one, up to Every of them,
// once Every are waiting or Interval has passed since the last
// checkpoint. Several may run: a checkpoint is published only if the
// chain's last message is still the one it links to (JetStream's
// expected last sequence), so exactly one chain results, and a writer
// that dies leaves its range to the next. The last writer goes first;
// the others wait twice as long before they try, so that usually one
// process does the hashing.
type Checkpointer struct {
	JS       jetstream.JetStream
	Key      ed25519.PrivateKey
	Every    int
	Interval time.Duration
	// Writer names this process in the checkpoints it writes.
	Writer string
	Log    *slog.Logger
	// Leaves, when set, are the leaves of the events this process
	// published: those are not read back.
	Leaves *Leaves
	// Counted, when set, is told of each checkpoint built: how many of
	// its events came from Leaves and how many were read back.
	Counted func(fromLeaves, readBack uint64)
	// Events, when set, makes the checkpoints say which events are
	// audit's (version 2, Checkpoint.Foreign): those its Leaves hold, and
	// those read back that carry audit's MAC, each event once. Set it
	// where audit publishes through Authenticating with the same key (an
	// authenticated bus, where only audit writes audit events); nil
	// writes checkpoints that do not say (version 1).
	Events *EventKey

	// recent are audit's events covered lately, by their leaf's first
	// bytes: a copy of one (same subject and bytes, MAC and all) is not
	// audit's. Kept for 2*MACWindow.
	recent        map[uint64]recentEvent
	recentCreated string    // the stream they are of
	prunedAt      time.Time // when recent was last pruned

	mine Tail // the last checkpoint this writer published
	// readBack counts the events read from the stream, known those
	// covered from Leaves.
	readBack, known atomic.Uint64
}

type recentEvent struct {
	seq uint64
	at  time.Time
}

// Covered reports how many events this writer's checkpoints took from its
// Leaves and how many they had to read back from the stream (those of
// checkpoints another writer published first included).
func (c *Checkpointer) Covered() (fromLeaves, readBack uint64) {
	return c.known.Load(), c.readBack.Load()
}

// Run writes checkpoints until ctx ends.
func (c *Checkpointer) Run(ctx context.Context) {
	c.defaults()
	if c.Leaves != nil {
		c.Leaves.on.Store(true)
	}
	for {
		wait := c.Interval/4 + jitter(c.Interval/4)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		for ctx.Err() == nil {
			more, err := c.Step(ctx)
			if err != nil {
				if ctx.Err() == nil {
					c.Log.Warn("audit checkpoint not written; retrying", "err", err)
				}
				break
			}
			if !more {
				break
			}
		}
	}
}

func (c *Checkpointer) defaults() {
	c.Every = min(cmp.Or(c.Every, DefaultEvery), MaxEvents)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	if c.Writer == "" {
		h, _ := os.Hostname()
		c.Writer = fmt.Sprintf("%s/%d/%s", h, os.Getpid(), randomID())
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Tail is where the chain ends: its last checkpoint (nil when there is
// none) and that checkpoint's sequence in AUDIT_CHAIN.
type Tail struct {
	Checkpoint *Checkpoint
	Seq        uint64
}

// LastCheckpoint reads the chain's last checkpoint.
func LastCheckpoint(ctx context.Context, js jetstream.JetStream) (Tail, error) {
	st, err := js.Stream(ctx, subjects.StreamAuditChain)
	if err != nil {
		return Tail{}, fmt.Errorf("checkpoint stream: %w", err)
	}
	last := st.CachedInfo().State.LastSeq
	if st.CachedInfo().State.Msgs == 0 {
		return Tail{Seq: last}, nil
	}
	m, err := st.GetMsg(ctx, last)
	if err != nil {
		return Tail{}, fmt.Errorf("reading checkpoint %d: %w", last, err)
	}
	cp, err := DecodeCheckpoint(m.Data)
	if err != nil {
		return Tail{}, fmt.Errorf("checkpoint %d: %w", last, err)
	}
	return Tail{Checkpoint: cp, Seq: last}, nil
}

// DecodeCheckpoint reads a checkpoint message and checks it is well formed
// (not its signature).
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	var cp Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := cp.wellFormed(); err != nil {
		return nil, err
	}
	return &cp, nil
}

// Step writes the next checkpoint if one is due, and reports whether more
// events wait for one at once.
func (c *Checkpointer) Step(ctx context.Context) (more bool, err error) {
	c.defaults()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	audit, err := c.JS.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		return false, fmt.Errorf("audit stream: %w", err)
	}
	info := audit.CachedInfo()
	created := info.Created.UTC().Format(time.RFC3339Nano)
	tail, err := c.lastCheckpoint(ctx)
	if err != nil {
		return false, err
	}
	start := info.State.FirstSeq
	prev := tail.Checkpoint
	if prev != nil && prev.StreamCreated == created {
		// What aged out or was removed before it was covered starts the
		// range later; Verify names the gap.
		start = max(prev.Last+1, start)
	}
	start = max(start, 1)
	if c.Leaves != nil {
		c.Leaves.forget(start)
	}
	if info.State.LastSeq < start {
		return false, nil
	}
	pending := info.State.LastSeq - start + 1
	every, interval := uint64(c.Every), c.Interval
	if prev != nil && prev.Writer != c.Writer {
		every, interval = 2*every, 2*interval
	}
	if prev != nil && pending < every {
		if t, err := time.Parse(time.RFC3339Nano, prev.Time); err == nil && time.Since(t) < interval {
			return false, nil
		}
	}
	n := min(pending, uint64(c.Every))
	if c.Events != nil {
		c.seedRecent(ctx, tail, created)
	}
	cp, err := c.build(ctx, info, start, start+n-1)
	if err != nil {
		return false, err
	}
	if prev != nil {
		cp.Prev = prev.Hash()
	}
	cp.Sign(c.Key)
	b, err := json.Marshal(cp)
	if err != nil {
		return false, err
	}
	ack, err := c.JS.PublishMsg(ctx, &nats.Msg{Subject: subjects.AuditCheckpoint, Data: b},
		jetstream.WithExpectLastSequence(tail.Seq), jetstream.WithExpectStream(subjects.StreamAuditChain))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return true, nil // another writer was first: look again from its checkpoint
	}
	if err != nil {
		return false, fmt.Errorf("publishing checkpoint %d..%d: %w", cp.First, cp.Last, err)
	}
	c.mine = Tail{Checkpoint: cp, Seq: ack.Sequence}
	return pending > n, nil
}

// lastCheckpoint is where the next checkpoint links: the chain's last
// checkpoint signed with this writer's key, and the chain's last sequence
// (Tail.Seq), which the next publish expects. Messages after that
// checkpoint that are not one, or are signed by another key, are passed
// over (Verify names them): whoever can publish on the chain cannot stop
// it or make it link to a forgery. The checkpoint this writer published
// last is not read again.
func (c *Checkpointer) lastCheckpoint(ctx context.Context) (Tail, error) {
	st, err := c.JS.Stream(ctx, subjects.StreamAuditChain)
	if err != nil {
		return Tail{}, fmt.Errorf("checkpoint stream: %w", err)
	}
	state := st.CachedInfo().State
	if c.mine.Checkpoint != nil && state.LastSeq == c.mine.Seq {
		return c.mine, nil
	}
	tail := Tail{Seq: state.LastSeq}
	if state.Msgs == 0 {
		return tail, nil
	}
	pub := c.Key.Public().(ed25519.PublicKey)
	for seq := state.LastSeq; seq >= max(state.FirstSeq, 1) && state.LastSeq-seq < maxPassedOver; seq-- {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return Tail{}, fmt.Errorf("reading checkpoint %d: %w", seq, err)
		}
		if cp, err := DecodeCheckpoint(m.Data); err == nil && cp.Check(pub) == nil {
			tail.Checkpoint = cp
			return tail, nil
		}
		c.Log.Warn("passing over a message of the audit chain that is not a checkpoint of this key", "seq", seq)
	}
	return tail, nil
}

// maxPassedOver bounds how far back a writer looks for its key's last
// checkpoint; past it, a new chain starts (Verify names the break).
const maxPassedOver = 1000

// draft is a checkpoint's per-sequence parts while it is made.
type draft struct {
	first, last  uint64
	leaves       []Hash
	ids, tenants []string
	times        []time.Time
}

// build makes the checkpoint of AUDIT's sequences first..last, unsigned
// and unlinked: the leaves its Leaves hold, the others read back.
func (c *Checkpointer) build(ctx context.Context, info *jetstream.StreamInfo, first, last uint64) (*Checkpoint, error) {
	n := last - first + 1
	d := &draft{first: first, last: last, leaves: make([]Hash, n), ids: make([]string, n), tenants: make([]string, n),
		times: make([]time.Time, n)}
	for i := range d.leaves {
		d.leaves[i] = absentLeaf
	}
	var missing []uint64
	var have map[uint64]known
	if c.Leaves != nil && info.Config.SubjectTransform == nil {
		// A transform would store another subject than the one published.
		have = c.Leaves.take(first, last, info.Created)
	}
	for seq := first; seq <= last; seq++ {
		k, ok := have[seq]
		if !ok {
			missing = append(missing, seq)
			continue
		}
		i := seq - first
		d.leaves[i], d.ids[i], d.tenants[i], d.times[i] = k.leaf, k.id, k.tenant, k.at
		// Acknowledged to this process's publish: audit's, a copy or not.
		c.remember(k.leaf, seq, k.at)
	}
	cp, err := c.complete(ctx, info, d, have, missing)
	if err != nil {
		// Taken again by the next try rather than read back.
		c.Leaves.restore(have)
		return nil, err
	}
	c.known.Add(n - uint64(len(missing)))
	c.readBack.Add(uint64(len(missing)))
	if c.Counted != nil {
		c.Counted(n-uint64(len(missing)), uint64(len(missing)))
	}
	return cp, nil
}

// complete reads back the missing sequences of d and makes the checkpoint.
func (c *Checkpointer) complete(ctx context.Context, info *jetstream.StreamInfo, d *draft, have map[uint64]known, missing []uint64) (*Checkpoint, error) {
	first, last := d.first, d.last
	leaves, ids, tenants, times := d.leaves, d.ids, d.tenants, d.times
	n := last - first + 1
	found := make(map[uint64]bool, len(missing))
	var foreign []uint64
	for _, r := range spans(missing) {
		err := readDirect(ctx, c.JS.Conn(), subjects.StreamAudit, r[0], r[1], func(e Event) error {
			i := e.Seq - first
			if _, ok := have[e.Seq]; ok {
				return nil // the bytes it stored when it was published are the ones covered
			}
			leaves[i] = LeafHash(e.Subject, e.Data)
			ids[i], tenants[i], times[i] = eventID(e.Data), tenantOf(e.Subject), e.Time
			found[e.Seq] = true
			if c.Events != nil && !c.audits(e, leaves[i]) {
				foreign = append(foreign, e.Seq)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("reading audit events %d..%d: %w", r[0], r[1], err)
		}
	}
	for _, seq := range missing {
		if found[seq] {
			continue
		}
		there, err := storedAt(ctx, c.JS.Conn(), subjects.StreamAudit, seq)
		if err != nil {
			return nil, err
		}
		if there {
			// A replica that lags answered the batch: try again later
			// rather than record an event as absent.
			return nil, fmt.Errorf("audit event %d was not in the batch read", seq)
		}
	}
	root := Root(leaves)
	prefixes := make([]byte, 0, n*prefixLen)
	for _, l := range leaves {
		prefixes = append(prefixes, l[:prefixLen]...)
	}
	var firstTime, lastTime time.Time
	for _, t := range times {
		if t.IsZero() {
			continue
		}
		if firstTime.IsZero() {
			firstTime = t
		}
		lastTime = t
	}
	now := time.Now().UTC()
	if lastTime.IsZero() {
		lastTime = now
	}
	if firstTime.IsZero() {
		firstTime = lastTime
	}
	v := VersionUnattested
	if c.Events != nil {
		v = Version
		slices.Sort(foreign)
		if len(foreign) > 0 {
			c.Log.Warn("audit checkpoint covers events no audit process wrote", "seqs", foreign)
		}
		c.forgetBefore(lastTime.Add(-2 * MACWindow))
	}
	return &Checkpoint{
		V: v, Foreign: foreign, Stream: subjects.StreamAudit, StreamCreated: info.Created.UTC().Format(time.RFC3339Nano), First: first, Last: last,
		Root: hex.EncodeToString(root[:]), Time: now.Format(time.RFC3339Nano),
		FirstTime: firstTime.UTC().Format(time.RFC3339Nano), LastTime: lastTime.UTC().Format(time.RFC3339Nano), Writer: c.Writer,
		Leaves: base64.StdEncoding.EncodeToString(prefixes), IDs: ids, Tenants: tenants,
	}, nil
}

// audits reports whether e, read back, is audit's: it carries audit's MAC
// and the same event (leaf) was not covered at another sequence lately (a
// copy, MAC and all, stored again). What is audit's is remembered.
func (c *Checkpointer) audits(e Event, leaf Hash) bool {
	if !c.Events.Authentic(leaf, e.Header, e.Time) {
		return false
	}
	if r, ok := c.recent[leafKey(leaf)]; ok && r.seq != e.Seq {
		return false
	}
	c.remember(leaf, e.Seq, e.Time)
	return true
}

func leafKey(l Hash) uint64 { return binary.BigEndian.Uint64(l[:8]) }

func (c *Checkpointer) remember(leaf Hash, seq uint64, at time.Time) {
	if c.Events == nil {
		return
	}
	if c.recent == nil {
		c.recent = make(map[uint64]recentEvent, 2*c.Every)
	}
	k := leafKey(leaf)
	if r, ok := c.recent[k]; ok && r.seq < seq {
		return // the first one stays the original
	}
	c.recent[k] = recentEvent{seq: seq, at: at}
}

// forgetBefore drops the events stored before t: a copy stored after
// them is more than MACWindow from its MAC's time. It walks the map at
// most every quarter of MACWindow, so that the walk costs little per
// event however many events two minutes hold.
func (c *Checkpointer) forgetBefore(t time.Time) {
	if t.Sub(c.prunedAt) < MACWindow/4 {
		return
	}
	c.prunedAt = t
	for id, r := range c.recent {
		if r.at.Before(t) {
			delete(c.recent, id)
		}
	}
}

// maxSeeded bounds the checkpoints read to learn the events another
// writer covered lately.
const maxSeeded = 256

// seedRecent learns the leaves of audit's events the checkpoints since
// this writer's last one covered, back to 2*MACWindow before the chain's end,
// when another writer wrote the last one: a copy of one of them is then
// not taken for audit's. A stream made again starts afresh.
func (c *Checkpointer) seedRecent(ctx context.Context, tail Tail, created string) {
	if c.recentCreated != created {
		c.recent, c.recentCreated = nil, created
	}
	if tail.Checkpoint == nil || tail.Checkpoint == c.mine.Checkpoint {
		return
	}
	end, err := time.Parse(time.RFC3339Nano, tail.Checkpoint.LastTime)
	if err != nil {
		return
	}
	st, err := c.JS.Stream(ctx, subjects.StreamAuditChain)
	if err != nil {
		return
	}
	pub := c.Key.Public().(ed25519.PublicKey)
	for seq, n := tail.Seq, 0; seq >= 1 && n < maxSeeded; seq, n = seq-1, n+1 {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue
		}
		cp, err := DecodeCheckpoint(m.Data)
		if err != nil || cp.Check(pub) != nil || cp.StreamCreated != created {
			continue
		}
		if c.mine.Checkpoint != nil && cp.Hash() == c.mine.Checkpoint.Hash() {
			return // from there on, known
		}
		at, err := time.Parse(time.RFC3339Nano, cp.LastTime)
		if err != nil || at.Before(end.Add(-2*MACWindow)) {
			return
		}
		foreign := map[uint64]bool{}
		for _, f := range cp.Foreign {
			foreign[f] = true
		}
		prefixes, _ := base64.StdEncoding.DecodeString(cp.Leaves)
		for i := range cp.Size() {
			var l Hash
			if seq := cp.First + i; !foreign[seq] && (i+1)*prefixLen <= uint64(len(prefixes)) {
				copy(l[:], prefixes[i*prefixLen:(i+1)*prefixLen])
				c.remember(l, seq, at)
			}
		}
	}
}

// spanGap: unknown sequences this close are read in one batch, the known
// ones between them passed over; a batch's request (a subscription, the
// request, its end) costs about as much as reading that many events.
const spanGap = 4

// maxSpans bounds the batches of one checkpoint: past it (events of
// several processes interleaved), the whole stretch is read at once.
const maxSpans = 8

// spans groups the sorted sequences seqs into ranges to read.
func spans(seqs []uint64) [][2]uint64 {
	var out [][2]uint64
	for _, s := range seqs {
		if len(out) > 0 && s-out[len(out)-1][1] <= spanGap {
			out[len(out)-1][1] = s
			continue
		}
		out = append(out, [2]uint64{s, s})
	}
	if len(out) > maxSpans {
		return [][2]uint64{{out[0][0], out[len(out)-1][1]}}
	}
	return out
}

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	n, err := rand.Int(rand.Reader, big.NewInt(int64(d)))
	if err != nil {
		return 0
	}
	return time.Duration(n.Int64())
}

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
