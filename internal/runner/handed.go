package runner

import (
	"bytes"
	"sync"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/seal"
)

// Handed holds the invocations a process's Runners handed on to a stage
// that runs in the same process, for that stage's Runner to take instead
// of decoding the hand-off it reads: when every stage shares a process
// (serve), each hop would otherwise decode the very bytes the hop before
// it had just encoded from an invocation it no longer needs. The hand-off
// is still published and stored, and read from the stream as before; only
// its decoding is saved, and only when the message read carries exactly
// the bytes encoded from the invocation held (anything else, such as a
// hand-off stored by an earlier attempt, is decoded as usual).
//
// A Runner gives an invocation up when it hands it on: from then on only
// the reader touches it. Invocations that end in an error are not held,
// so an error's cause and details reach the next stage only as their
// encoding does, as they would from another process.
type Handed struct {
	local map[string]bool // the stages whose Runners read here

	mu    sync.Mutex
	held  map[string]heldInvocation // by the hand-off's message id
	queue []heldKey                 // oldest first, from head on
	head  int
	n     int // invocations held
	size  int // their hand-offs' bytes
	seq   uint64
}

type heldInvocation struct {
	data []byte
	inv  *envelope.Invocation
	seq  uint64
	// The hand-off as it was signed (signed): its subject, its signer and
	// the header that proves it (its MAC, or its signature), once sent.
	subject, signer string
	proofKey, proof string
}

type heldKey struct {
	id  string
	seq uint64
}

// Bounds on what Handed holds: a hand-off read by a process of its own,
// or lost, is never taken, and leaves only when these push it out.
const (
	handedMax      = 1024
	handedMaxBytes = 8 << 20
)

// NewHanded returns a Handed for the stages that read in this process.
func NewHanded(stages []string) *Handed {
	h := &Handed{local: map[string]bool{}, held: map[string]heldInvocation{}}
	for _, s := range stages {
		h.local[s] = true
	}
	return h
}

// put holds inv, encoded as data, handed on to stage next under message
// id. It reports whether inv was held: if so, the caller must not touch it
// again.
func (h *Handed) put(next, id string, data []byte, inv *envelope.Invocation) bool {
	if h == nil || !h.local[next] || id == "" || inv.Error != nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.held[id]; ok {
		h.n--
		h.size -= len(old.data)
	}
	h.seq++
	h.held[id] = heldInvocation{data: data, inv: inv, seq: h.seq}
	h.queue = append(h.queue, heldKey{id, h.seq})
	h.n++
	h.size += len(data)
	// Keys of invocations taken stay queued until the head passes them;
	// the oldest held goes once too many wait behind it.
	h.dropTaken()
	for (h.n > handedMax || h.size > handedMaxBytes || len(h.queue)-h.head > 4*handedMax) && h.evictOldest() {
	}
	if h.head > len(h.queue)/2 && h.head > 64 {
		h.queue = append(h.queue[:0], h.queue[h.head:]...)
		h.head = 0
	}
	return true
}

// dropTaken advances the queue past the keys of invocations no longer
// held. h.mu is held.
func (h *Handed) dropTaken() {
	for h.head < len(h.queue) {
		k := h.queue[h.head]
		if e, ok := h.held[k.id]; ok && e.seq == k.seq {
			return
		}
		h.queue[h.head] = heldKey{}
		h.head++
	}
}

// evictOldest drops the oldest invocation still held, reporting whether
// there was one. h.mu is held.
func (h *Handed) evictOldest() bool {
	h.dropTaken()
	if h.head == len(h.queue) {
		return false
	}
	k := h.queue[h.head]
	h.queue[h.head] = heldKey{}
	h.head++
	e := h.held[k.id]
	delete(h.held, k.id)
	h.n--
	h.size -= len(e.data)
	return true
}

// signed records how the hand-off held under id, data, was signed: h is
// the header it was published with. A copy read back with that very
// subject, data, signer and proof is what this process sent, and its
// check would only recompute the proof (takeSigned).
func (h *Handed) signed(id, subject string, data []byte, signed nats.Header) {
	if h == nil || id == "" || signed == nil || signed.Get(seal.HeaderSeal) != "" {
		return
	}
	key := seal.HeaderMAC
	proof := signed.Get(key)
	if proof == "" {
		key = seal.HeaderSignature
		proof = signed.Get(key)
	}
	signer := signed.Get(seal.HeaderSigner)
	if proof == "" || signer == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.held[id]
	if !ok || !sameBytes(e.data, data) {
		return // taken already, or held again since
	}
	e.subject, e.signer, e.proofKey, e.proof = subject, signer, key, proof
	h.held[id] = e
}

// sameBytes reports whether a and b are the same slice, not just equal.
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// takeSigned is take for a message read on subject with header hdr whose
// sender is not checked yet: it returns the invocation only when the
// message is, byte for byte, the hand-off this process signed and sent
// (signed), whose check would recompute the very proof it carries.
// Anything else, a proof not yet recorded included, is left to the check.
func (h *Handed) takeSigned(subject string, hdr nats.Header, data []byte) *envelope.Invocation {
	if h == nil {
		return nil
	}
	id := hdr.Get(jetstream.MsgIDHeader)
	if id == "" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.held[id]
	if !ok || e.proof == "" || e.subject != subject || hdr.Get(seal.HeaderSigner) != e.signer ||
		hdr.Get(seal.HeaderSeal) != "" || !seal.EqualSecret(hdr.Get(e.proofKey), e.proof) || !bytes.Equal(e.data, data) {
		return nil
	}
	if e.proofKey == seal.HeaderSignature && hdr.Get(seal.HeaderMAC) != "" {
		return nil // the check would read the MAC, not the signature
	}
	if !busauth.MayPublish(busauth.Role(e.signer), subject) {
		return nil // the check refuses it as it would any role's
	}
	delete(h.held, id)
	h.n--
	h.size -= len(e.data)
	return e.inv
}

// take returns the invocation handed on under message id if data is
// exactly what it was encoded to, and gives it up; nil otherwise.
func (h *Handed) take(id string, data []byte) *envelope.Invocation {
	if h == nil || id == "" {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.held[id]
	if !ok || !bytes.Equal(e.data, data) {
		return nil
	}
	delete(h.held, id)
	h.n--
	h.size -= len(e.data)
	return e.inv
}
