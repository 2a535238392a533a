package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"slices"
	"sync"
)

// recentSize is how many signatures a process remembers having made. At
// about eight signatures a call it covers the hops of some two thousand
// calls in flight; a signature pushed out is only verified the long way.
const recentSize = 1 << 14

// verify is ed25519.Verify; tests count its calls.
var verify = ed25519.Verify

// recent remembers the signatures this process made, so that a role of the
// same process reading what another of its roles signed (in `serve` every
// hop but the agent's) need not verify it again. A signature this process
// made with a key over a text verifies under that key's public half by
// construction, so finding it here is the same answer as ed25519.Verify,
// at the price of a map lookup instead of a scalar multiplication. What
// was signed elsewhere, or altered since, misses and is verified.
type recent struct {
	mu    sync.Mutex
	seen  map[[ed25519.SignatureSize]byte][sha256.Size]byte // signature → digest of public key and text
	order [][ed25519.SignatureSize]byte                     // ring, oldest first from next
	next  int

	// The hand-offs' MACs, apart: a MAC that verifies binds its key and
	// text already, so it is its own key, with nothing beside it, in a
	// map a third the size of seen's.
	macMu    sync.Mutex
	macs     map[[sha256.Size]byte]struct{}
	macOrder [][sha256.Size]byte // ring, oldest first from macNext
	macNext  int
}

func newRecent(n int) *recent {
	return &recent{seen: make(map[[ed25519.SignatureSize]byte][sha256.Size]byte, n), order: make([][ed25519.SignatureSize]byte, n)}
}

func recentDigest(pub []byte, text []byte) [sha256.Size]byte {
	// One call over a buffer on the stack: a hash.Hash would be made, and
	// text would escape through its Write.
	var buf [max(signedMax, sealTextMax) + ed25519.PublicKeySize]byte
	return sha256.Sum256(append(append(buf[:0], pub...), text...))
}

// slot is where sig, an Ed25519 signature, is remembered.
func slot(sig []byte) ([ed25519.SignatureSize]byte, bool) {
	var k [ed25519.SignatureSize]byte
	if len(sig) != ed25519.SignatureSize {
		return k, false
	}
	copy(k[:], sig)
	return k, true
}

// add remembers that sig is pub's signature over text (or, for a MAC, the
// MAC under the key pub).
func (r *recent) add(pub []byte, text, sig []byte) {
	k, ok := slot(sig)
	if r == nil || !ok {
		return
	}
	r.put(k, recentDigest(pub, text))
}

// put remembers signature k beside digest d.
func (r *recent) put(k [ed25519.SignatureSize]byte, d [sha256.Size]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The slot's old signature may have been taken already, or made
	// again since (signatures are deterministic); forgetting it early
	// costs one verification, never a wrong answer.
	delete(r.seen, r.order[r.next])
	r.order[r.next] = k
	r.next = (r.next + 1) % len(r.order)
	r.seen[k] = d
}

// addMAC remembers that this process made sum, a hand-off's MAC.
func (r *recent) addMAC(sum []byte) {
	if r == nil || len(sum) != sha256.Size {
		return
	}
	k := [sha256.Size]byte(sum)
	r.macMu.Lock()
	defer r.macMu.Unlock()
	if r.macOrder == nil { // the Sealer's remembers no MACs
		r.macs, r.macOrder = make(map[[sha256.Size]byte]struct{}, len(r.order)), make([][sha256.Size]byte, len(r.order))
	}
	// As in put: the slot's old MAC may have been taken already.
	delete(r.macs, r.macOrder[r.macNext])
	r.macOrder[r.macNext] = k
	r.macNext = (r.macNext + 1) % len(r.macOrder)
	r.macs[k] = struct{}{}
}

// takeMAC reports whether this process made sum, a MAC the caller has
// verified, forgetting it.
func (r *recent) takeMAC(sum []byte) bool {
	if r == nil || len(sum) != sha256.Size {
		return false
	}
	k := [sha256.Size]byte(sum)
	r.macMu.Lock()
	defer r.macMu.Unlock()
	if _, ok := r.macs[k]; ok {
		delete(r.macs, k)
		return true
	}
	return false
}

// take reports whether sig is a signature this process made with pub over
// text, forgetting it: a message is read once; a redelivery verifies.
func (r *recent) take(pub []byte, text, sig []byte) bool {
	k, ok := slot(sig)
	if r == nil || !ok {
		return false
	}
	r.mu.Lock()
	d, ok := r.seen[k]
	if ok {
		delete(r.seen, k)
	}
	r.mu.Unlock()
	return ok && d == recentDigest(pub, text)
}

// verified is pub's check of sig over text: remembered, or verified.
func (r *recent) verified(pub ed25519.PublicKey, text, sig []byte) bool {
	ok, _ := r.check(pub, text, sig)
	return ok
}

// check is verified, also reporting whether the signature is one this
// process made (ours).
func (r *recent) check(pub ed25519.PublicKey, text, sig []byte) (ok, ours bool) {
	if r.take(pub, text, sig) {
		return true, true
	}
	// Copies: what verify is handed escapes, and the callers' buffers,
	// for what this process made, stay on their stacks.
	return verify(pub, slices.Clone(text), slices.Clone(sig)), false
}
