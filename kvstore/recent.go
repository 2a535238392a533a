package kvstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
)

// What a compare-and-swap costs, and what is remembered so it costs less:
// update reads a key (a request to the server and its reply) before it
// writes it at the revision read. The keys of an invocation's status and of
// a session's usage are written several times by the stages of one
// process (validate claims the id, execute claims the run, audit records
// the end; authorize reserves, audit charges), each time at the revision
// this process wrote last. A bucket that remembers its writes keeps, per
// key, the revision and the bytes this process last wrote, and update
// first tries its change on those: the write at that revision succeeds only
// if the key still holds exactly those bytes, so the change was decided on
// the stored value, as after a read. If another process wrote the key
// since, the write is refused and update reads and tries again as it
// always did; a change that decides to write nothing, or refuses, on the
// remembered value is decided again on a fresh read, since only a write
// confirms that the value it was given was current.

// maxRecent bounds the keys a bucket remembers; past it each new key
// takes the place of the one remembered longest, which costs that key a
// read, as without the memory.
const maxRecent = 4096

// recentWrites is the revision and value this process last wrote per key,
// or read, where a read is followed by a write of the same key (a session's
// usage, read for the policy and then charged). The writes are kept in a
// ring the map indexes: a map's element over 128 bytes (a recentWrite
// holds a whole record) is allocated on each insert, two a call; a slot
// of the ring, once the ring is full, never is.
type recentWrites struct {
	mu   sync.Mutex
	m    map[string]int32
	ring []recentWrite
	next int32 // the slot the next new key takes once the ring is full
}

type recentWrite struct {
	key string // the key the slot holds
	rev uint64
	val []byte
	// usage is val decoded, kept once RecentUsage needed it: a budget's
	// calls judge the same record many times between its writes.
	usage *Usage
	// rec is val decoded, when val is a status record without pointers
	// or slices (flatRecord): validate's claim and execute's, which the
	// next stage's read or compare-and-swap starts from, on every call.
	rec    api.Record
	hasRec bool
	// bucket is val decoded, when val is a rate-limit bucket: its list of
	// the calls given tokens is most of its bytes.
	bucket *Bucket
}

// flatRecord reports whether v is a status record that a copy holds
// whole (no pointer or slice to share) and that reads back from its
// encoding as it is (valid UTF-8, a UTC time), and returns it then.
func flatRecord(v any) (api.Record, bool) {
	r, ok := v.(*api.Record)
	if !ok || r.Error != nil || r.Response != nil || r.Progress != nil || r.Checkpoint != nil || r.DocumentPins != nil || r.Site != nil ||
		r.UpdatedAt.Location() != time.UTC {
		return api.Record{}, false
	}
	for _, s := range [...]string{r.InvocationID, r.Tenant, string(r.Status), r.Agent, r.ToolID, r.ToolVersion, r.Digest, r.Ending, r.CancelSig, r.CancelBy} {
		if !utf8.ValidString(s) {
			return api.Record{}, false
		}
	}
	rec := *r
	rec.UpdatedAt = rec.UpdatedAt.Round(0) // as decoded: no monotonic reading
	return rec, true
}

// decoded sets *v to the value w holds decoded, if it holds one of v's
// type, and reports whether it did.
func (w *recentWrite) decoded(v any) bool {
	if r, ok := v.(*api.Record); ok && w.hasRec {
		*r = w.rec
		return true
	}
	if b, ok := v.(*Bucket); ok && w.bucket != nil {
		*b = *w.bucket
		b.Took = slices.Clone(b.Took) // the caller's to append to
		return true
	}
	return false
}

func (r *recentWrites) get(key string) (recentWrite, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.m[key]
	if !ok {
		return recentWrite{}, false
	}
	return r.ring[i], true
}

// put remembers val, written to key at rev; v, when not nil, is val
// decoded.
func (r *recentWrites) put(key string, rev uint64, val []byte, v any) {
	w := recentWrite{key: key, rev: rev, val: val}
	if v != nil {
		w.rec, w.hasRec = flatRecord(v)
		if b, ok := v.(*Bucket); ok {
			w.bucket = &Bucket{Tokens: b.Tokens, At: b.At.Round(0), Took: slices.Clone(b.Took)}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.m[key]; ok {
		r.ring[i] = w
		return
	}
	if r.m == nil {
		r.m = make(map[string]int32)
	}
	if len(r.ring) < maxRecent {
		r.m[key] = int32(len(r.ring))
		r.ring = append(r.ring, w)
		return
	}
	i := r.next
	r.next = (i + 1) % maxRecent
	if j, ok := r.m[r.ring[i].key]; ok && j == i {
		delete(r.m, r.ring[i].key)
	}
	r.m[key] = i
	r.ring[i] = w
}

// keepUsage remembers u as the decoded value of key at rev, if that is
// still what r holds.
func (r *recentWrites) keepUsage(key string, rev uint64, u *Usage) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.m[key]; ok && r.ring[i].rev == rev {
		r.ring[i].usage = u
	}
}

func (r *recentWrites) forget(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i, ok := r.m[key]; ok {
		delete(r.m, key)
		r.ring[i] = recentWrite{} // nothing of it is kept
	}
}

// remembering is a bucket whose update remembers its writes.
type remembering struct {
	bounded
	recent *recentWrites
}

// recentOf returns the writes kv remembers, or nil.
func recentOf(kv jetstream.KeyValue) *recentWrites {
	if r, ok := kv.(remembering); ok {
		return r.recent
	}
	return nil
}

// errStale reports a remembered revision that is not the key's any more.
var errStale = errors.New("remembered revision is stale")

// updateRemembered tries fn on the value this process last wrote to key
// and writes the result at that revision. It returns errStale when update
// must read instead: nothing remembered, a change that writes nothing or
// refuses, or a key written since. Any other error is the write's own.
//
// A key the caller expects to be new (fresh) and that nothing is remembered
// of is tried the same way as missing: fn on the zero value, written with
// Create, which succeeds only if the key does not exist.
func updateRemembered[T any](ctx context.Context, kv jetstream.KeyValue, recent *recentWrites, key string, fresh bool, fn func(v *T, exists bool) error) (T, uint64, error) {
	var zero, v T
	w, ok := recent.get(key)
	switch {
	case ok:
		if !w.decoded(&v) && decodeOwn(w.val, &v) != nil {
			return zero, 0, errStale
		}
	case !fresh:
		return zero, 0, errStale
	}
	if err := fn(&v, ok); err != nil {
		return zero, 0, errStale
	}
	val, err := encodeValue(&v) // not v: boxing would copy it
	if err != nil {
		return zero, 0, err
	}
	var next uint64
	if ok {
		next, err = kv.Update(ctx, key, val, w.rev)
	} else {
		next, err = kv.Create(ctx, key, val)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		recent.forget(key)
		return zero, 0, errStale
	case err != nil:
		return zero, 0, err
	}
	recent.put(key, next, val, &v)
	return v, next, nil
}

// encodeValue is the encoding of the values update writes, on every status
// and usage write of a call: github.com/segmentio/encoding/json, about five
// times faster than encoding/json on a status record. Readers decode it
// with encoding/json to the same value (it differs only in writing the
// zero value of omitzero fields, which read back as zero).
func encodeValue(v any) ([]byte, error) { return segjson.Marshal(v) }

// decodeOwn reads bytes encodeValue wrote in this process (a remembered
// write), valid JSON by construction. Should the fast decoder refuse them,
// or panic, the caller reads the key instead, as when nothing is
// remembered.
func decodeOwn(b []byte, v any) (err error) {
	defer func() {
		if recover() != nil {
			err = errStale
		}
	}()
	return segjson.Unmarshal(b, v)
}

// decodeStored reads a value from the bucket, written by any process:
// bytes encoding/json's scanner finds valid are read by the fast decoder
// (which is lenient about what it copies into a json.RawMessage, hence the
// scan), anything else by encoding/json, whose verdict stands.
func decodeStored(b []byte, v any) error {
	if json.Valid(b) {
		if decodeOwn(b, v) == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero() // what it read before it failed
	}
	return json.Unmarshal(b, v)
}

// decodeEntry is decodeStored of e, read from key in kv: bytes this
// process wrote there at that revision, as it remembers them, are its
// own (decodeOwn), without the scan. An invocation's status is read back
// so on every call (execute reads the record validate's claim wrote).
func decodeEntry(kv jetstream.KeyValue, key string, e jetstream.KeyValueEntry, v any) error {
	if w, ok := rememberedEntry(kv, key, e); ok {
		if w.decoded(v) || decodeOwn(w.val, v) == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	return decodeStored(e.Value(), v)
}

// rememberedEntry returns what kv remembers of key when e, read from it,
// holds the very bytes this process wrote there at that revision.
func rememberedEntry(kv jetstream.KeyValue, key string, e jetstream.KeyValueEntry) (recentWrite, bool) {
	if r := recentOf(kv); r != nil {
		if w, ok := r.get(key); ok && w.rev == e.Revision() && bytes.Equal(w.val, e.Value()) {
			return w, true
		}
	}
	return recentWrite{}, false
}
