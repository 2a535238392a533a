package auditchain

import (
	"context"
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/subjects"
)

// HeaderEventMAC carries what authenticates an audit event as audit's:
// "<unix nanoseconds>.<HMAC-SHA256, base64url>" (EventKey).
const HeaderEventMAC = "Toolgate-Audit-MAC"

// eventMACInfo names the derivation of the event key from the chain key.
const eventMACInfo = "toolgate-audit-event-mac-v1"

// MACWindow is how far an event's stored time may be from the time its MAC
// names: a copy of an event stored later than that is not audit's. Within
// it, the checkpointer takes an event id only once.
const MACWindow = time.Minute

// EventKey authenticates the events audit publishes to the checkpointer:
// an HMAC-SHA256 under a key derived from the chain key, which every audit
// process holds and nothing else does. A MAC costs a hash per event where
// a signature would cost a scalar multiplication (and the checkpoint, one
// signature per range, is what proves anything to a third party); only
// audit checks it, so nobody else needs the key. The MAC covers the
// subject, the bytes and when the event was published, so neither another
// tenant's subject nor a later copy passes (the checkpointer takes each
// event once within MACWindow).
type EventKey struct {
	pool sync.Pool // *macState keyed with the event key
}

// macState is one MAC's hash and scratch space, reused.
type macState struct {
	h   hash.Hash
	pre [160]byte
	sum [sha256.Size]byte
}

// NewEventKey derives the event key of the chain key k.
func NewEventKey(k ed25519.PrivateKey) *EventKey {
	key, err := hkdf.Key(sha256.New, k.Seed(), nil, eventMACInfo, sha256.Size)
	if err != nil {
		panic(err) // only for lengths beyond 255 hashes
	}
	e := &EventKey{}
	e.pool.New = func() any { return &macState{h: hmac.New(sha256.New, key)} }
	return e
}

// tag computes the MAC over at and the event's leaf (its subject and
// bytes, hashed once for the MAC and the checkpoint alike) into st.sum.
func (st *macState) tag(at int64, leaf Hash) []byte {
	st.h.Reset()
	b := strconv.AppendInt(st.pre[:0], at, 10)
	b = append(b, '\n')
	b = append(b, leaf[:]...)
	st.h.Write(b)
	return st.h.Sum(st.sum[:0])
}

// macLen is the length of a MAC in the header (base64url, unpadded).
var macLen = base64.RawURLEncoding.EncodedLen(sha256.Size)

// Header is the HeaderEventMAC value of the event whose leaf is leaf
// (LeafHash of its subject and bytes), published at at.
func (e *EventKey) Header(leaf Hash, at time.Time) string { return e.values(leaf, at)[0] }

// macValue is a HeaderEventMAC value and its bytes in one allocation,
// not a string and a slice: b is written once, before v.
type macValue struct {
	b [20 + 1 + 43]byte
	v [1]string
}

// values is Header's value as the header's values.
func (e *EventKey) values(leaf Hash, at time.Time) []string {
	st := e.pool.Get().(*macState)
	n := at.UnixNano()
	tag := st.tag(n, leaf)
	v := new(macValue)
	b := strconv.AppendInt(v.b[:0], n, 10)
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, tag)
	e.pool.Put(st)
	v.v[0] = unsafe.String(&v.b[0], len(b))
	return v.v[:]
}

// Authentic reports whether h's MAC is the key's over the event whose leaf
// is leaf, and stored (when the stream stored the event) within MACWindow
// of the time it names.
func (e *EventKey) Authentic(leaf Hash, h nats.Header, stored time.Time) bool {
	v := h.Get(HeaderEventMAC)
	at, mac, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(mac)
	if err != nil || len(mac) != macLen {
		return false
	}
	st := e.pool.Get().(*macState)
	ok = hmac.Equal(got, st.tag(n, leaf))
	e.pool.Put(st)
	if !ok {
		return false
	}
	d := stored.Sub(time.Unix(0, n))
	return d <= MACWindow && d >= -MACWindow
}

// Authenticating returns js, whose publishes onto audit subjects carry
// the event key's MAC: give it to audit's connection. The leaf hashed for
// the MAC is handed to l (when set) for the event's acknowledgement, so
// that it is not hashed again.
func Authenticating(js jetstream.JetStream, e *EventKey, l *Leaves) jetstream.JetStream {
	if e == nil {
		return js
	}
	return &macJS{JetStream: js, e: e, l: l}
}

type macJS struct {
	jetstream.JetStream
	e *EventKey
	l *Leaves
}

func (j *macJS) Publish(ctx context.Context, subject string, data []byte, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return j.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *macJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := j.JetStream.PublishMsg(ctx, j.mac(m), opts...)
	if err != nil {
		j.l.drop(m)
	}
	return ack, err
}

func (j *macJS) PublishAsync(subject string, data []byte, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	return j.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data}, opts...)
}

func (j *macJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f, err := j.JetStream.PublishMsgAsync(j.mac(m), opts...)
	if err != nil {
		j.l.drop(m)
	}
	return f, err
}

// mac sets m's MAC header. The message is changed in place, as the
// publish itself changes it (it adds the message id to the same header).
func (j *macJS) mac(m *nats.Msg) *nats.Msg {
	if !subjects.IsAudit(m.Subject) {
		return m
	}
	leaf := LeafHash(m.Subject, m.Data)
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[HeaderEventMAC] = j.e.values(leaf, time.Now())
	j.l.hashed(m, leaf)
	return m
}
