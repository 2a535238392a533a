package auditchain

import (
	"bytes"
	"crypto/sha256"
	"errors"
)

// Hash is a SHA-256 digest: a leaf, a node or a tree root.
type Hash = [sha256.Size]byte

// LeafHash is RFC 9162's leaf hash of one audit event: SHA-256(0x00 ||
// entry), where the entry is the event's subject, a newline, and its
// stored bytes (Entry). The subject is part of it because it carries the
// tenant, which a reader filters by; a NATS subject holds no newline, so
// the split is unambiguous.
func LeafHash(subject string, data []byte) Hash {
	h := sha256.New()
	h.Write([]byte{0})
	h.Write([]byte(subject))
	h.Write([]byte{'\n'})
	h.Write(data)
	var out Hash
	h.Sum(out[:0])
	return out
}

// absentLeaf is the leaf of a sequence the checkpointer found no message
// at (deleted before it was covered): the hash of an empty entry, which no
// event has (every event has a subject).
var absentLeaf = func() Hash { return sha256.Sum256([]byte{0}) }()

func nodeHash(l, r Hash) Hash {
	var buf [1 + 2*sha256.Size]byte
	buf[0] = 1
	copy(buf[1:], l[:])
	copy(buf[1+sha256.Size:], r[:])
	return sha256.Sum256(buf[:])
}

// split is RFC 9162's k: the largest power of two smaller than n (n > 1).
func split(n int) int {
	k := 1
	for k<<1 < n {
		k <<= 1
	}
	return k
}

// Root is the Merkle tree hash (RFC 9162 section 2.1.1) of leaves.
func Root(leaves []Hash) Hash {
	switch len(leaves) {
	case 0:
		return sha256.Sum256(nil)
	case 1:
		return leaves[0]
	}
	k := split(len(leaves))
	return nodeHash(Root(leaves[:k]), Root(leaves[k:]))
}

// InclusionProof is the audit path (RFC 9162 section 2.1.3.1) of leaf m
// in the tree of leaves.
func InclusionProof(m int, leaves []Hash) []Hash {
	n := len(leaves)
	if m < 0 || m >= n || n < 2 {
		return nil
	}
	k := split(n)
	if m < k {
		return append(InclusionProof(m, leaves[:k]), Root(leaves[k:]))
	}
	return append(InclusionProof(m-k, leaves[k:]), Root(leaves[:k]))
}

// ErrProof is returned for an inclusion proof that does not lead to the root.
var ErrProof = errors.New("inclusion proof does not verify")

// VerifyInclusion checks an inclusion proof of leaf at index m of a tree
// of size n against root (RFC 9162 section 2.1.3.2).
func VerifyInclusion(leaf Hash, m, n uint64, path []Hash, root Hash) error {
	if m >= n {
		return ErrProof
	}
	fn, sn := m, n-1
	r := leaf
	for _, p := range path {
		if sn == 0 {
			return ErrProof
		}
		if fn&1 == 1 || fn == sn {
			r = nodeHash(p, r)
			for fn&1 == 0 && fn != 0 {
				fn >>= 1
				sn >>= 1
			}
		} else {
			r = nodeHash(r, p)
		}
		fn >>= 1
		sn >>= 1
	}
	if sn != 0 || !bytes.Equal(r[:], root[:]) {
		return ErrProof
	}
	return nil
}
