// Package auditchain makes the AUDIT stream tamper-evident (docs/audit.md):
// the audit stage signs checkpoints, each a Merkle root (RFC 9162) over a
// range of AUDIT's sequences and the hash of the checkpoint before it, on
// a stream of their own; Verify checks the stream, or an export of it,
// against them and names what was altered, deleted, inserted or moved.
package auditchain

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
	"github.com/toolgate/toolgate/subjects"
)

// Version is the checkpoint format's version. 3 signs a head: the root,
// the link and Foreign, with a hash of the listing (Leaves, IDs, Tenants)
// instead of the listing itself, so that one event's proof can be handed
// to its caller without the ids and tenants of every other event covered.
// 2 signs the listing itself and says which events of the range no audit
// process wrote (Foreign); 1 (checkpoints made by an audit on a bus
// without authentication, where every stage publishes its own events)
// does not say. All three are read.
const (
	Version           = 3
	VersionListed     = 2
	VersionUnattested = 1
)

// listingDomain starts what a v3 checkpoint's Listing hashes, so that the
// hash of a listing is never that of a checkpoint or a receipt body.
const listingDomain = "toolgate-listing-v1\n"

// prefixLen is how many bytes of each leaf hash a checkpoint lists, to
// point at the event that changed; the root, over the full hashes, is what
// proves it.
const prefixLen = 8

// Checkpoint is one signed link of the chain: it covers AUDIT's
// sequences First to Last of the stream created at StreamCreated. Every
// field but Sig is signed; times are RFC 3339 strings so that a decoded
// checkpoint encodes to the bytes that were signed.
type Checkpoint struct {
	V      int    `json:"v"`
	Stream string `json:"stream"`
	// StreamCreated is when AUDIT was created (JetStream's record): a
	// stream deleted and made again has another, and sequences that
	// start over.
	StreamCreated string `json:"stream_created"`
	First         uint64 `json:"first"`
	Last          uint64 `json:"last"`
	// Root is the Merkle tree hash (hex) of the leaves of First..Last in
	// order: LeafHash of each event, or of an empty entry for a sequence
	// that held no message when the checkpoint was made.
	Root string `json:"root"`
	// Prev is the Hash of the checkpoint before it; empty for the first.
	Prev string `json:"prev"`
	// Time is when the checkpoint was made; FirstTime and LastTime when
	// its first and last events were stored (how Verify tells events
	// AUDIT's age limit removed from deleted ones).
	Time      string `json:"time"`
	FirstTime string `json:"first_time"`
	LastTime  string `json:"last_time"`
	// Writer names the audit process that made it.
	Writer string `json:"writer"`
	// Leaves are the first bytes of each leaf hash (base64), IDs each
	// event's CloudEvent id and Tenants its tenant (subject token): what
	// a verifier needs to name an event that is gone or changed.
	// In version 3 they are not signed themselves: Listing is.
	Leaves  string   `json:"leaves,omitempty"`
	IDs     []string `json:"ids,omitempty"`
	Tenants []string `json:"tenants,omitempty"`
	// Foreign (version 2) are the sequences of the range, in order, whose
	// event no audit process wrote: neither acknowledged to this writer's
	// publishes nor carrying audit's MAC (EventKey), or a copy of an event
	// already covered. Every other event of the range is audit's. They
	// stay in the root, so that what was there is fixed too.
	Foreign []uint64 `json:"foreign,omitempty"`
	// Listing (version 3) is the SHA-256 (hex) of the listing (ListingHash):
	// the signature covers it, and the listing travels beside it, for
	// auditors; a head (Head) leaves the listing out.
	Listing string `json:"listing,omitempty"`
	// Key is the public key (nkey, N…) the checkpoint is signed with.
	Key string `json:"key"`
	Sig string `json:"sig,omitempty"`
}

// Size is the number of sequences the checkpoint covers.
func (c *Checkpoint) Size() uint64 {
	if c.Last < c.First {
		return 0
	}
	return c.Last - c.First + 1
}

// body is what is signed and hashed: the checkpoint without Sig, and in
// version 3 without the listing, which Listing stands for. (The listing's
// members are never empty in a well-formed checkpoint, so omitempty does
// not change a v1 or v2 body.)
func (c *Checkpoint) body() []byte {
	cc := *c
	cc.Sig = ""
	if c.V >= Version {
		cc.Leaves, cc.IDs, cc.Tenants = "", nil, nil
	}
	b, _ := json.Marshal(cc) // strings, numbers and string slices only
	return b
}

// ListingHash is what a v3 checkpoint's Listing must be for its Leaves,
// IDs and Tenants: SHA-256 (hex) of a domain string and their JSON.
func (c *Checkpoint) ListingHash() string {
	b, _ := json.Marshal(struct {
		Leaves  string   `json:"leaves"`
		IDs     []string `json:"ids"`
		Tenants []string `json:"tenants"`
	}{c.Leaves, c.IDs, c.Tenants})
	h := sha256.New()
	h.Write([]byte(listingDomain))
	h.Write(b)
	return hex.EncodeToString(h.Sum(nil))
}

// Listed reports whether the checkpoint carries its listing (a head of
// version 3 does not).
func (c *Checkpoint) Listed() bool { return c.Leaves != "" || c.IDs != nil || c.Tenants != nil }

// Head is a v3 checkpoint without its listing: what it signs, and nothing
// naming the events it covers but their number and Foreign's sequences.
// It is what a caller is shown of the checkpoint that proves its own call.
// Of an older version it is nil: their signature covers the listing.
func (c *Checkpoint) Head() *Checkpoint {
	if c.V < Version {
		return nil
	}
	h := *c
	h.Leaves, h.IDs, h.Tenants = "", nil, nil
	return &h
}

// Hash is the checkpoint's identity in the chain: SHA-256 of its signed
// body, hex. The next checkpoint's Prev names it.
func (c *Checkpoint) Hash() string {
	h := sha256.Sum256(c.body())
	return hex.EncodeToString(h[:])
}

// Sign sets Key, in version 3 Listing (the hash of the listing it
// holds), and Sig.
func (c *Checkpoint) Sign(k ed25519.PrivateKey) {
	c.Key = KeyID(k.Public().(ed25519.PublicKey))
	if c.V >= Version {
		c.Listing = c.ListingHash()
	}
	c.Sig = ""
	c.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(k, c.body()))
}

// Errors of checking a checkpoint.
var (
	ErrForged    = errors.New("checkpoint signature does not verify")
	ErrMalformed = errors.New("malformed checkpoint")
	// ErrListing: a v3 checkpoint's listing is not the one its signed
	// Listing hash names.
	ErrListing = errors.New("the checkpoint's listing does not match its signed hash")
)

// Check verifies a whole checkpoint, listing included: its signature with
// pub, that its fields agree with each other and, in version 3, that the
// listing is the one its signed hash names.
func (c *Checkpoint) Check(pub ed25519.PublicKey) error {
	if err := c.wellFormed(); err != nil {
		return err
	}
	if err := c.checkSig(pub); err != nil {
		return err
	}
	return c.checkListing()
}

// CheckHead verifies what a v3 head signs (the listing, when present,
// against its hash too); a checkpoint of an older version is checked whole.
func (c *Checkpoint) CheckHead(pub ed25519.PublicKey) error {
	if c.V < Version || c.Listed() {
		return c.Check(pub)
	}
	if err := c.headWellFormed(); err != nil {
		return err
	}
	return c.checkSig(pub)
}

func (c *Checkpoint) checkSig(pub ed25519.PublicKey) error {
	sig, err := base64.StdEncoding.DecodeString(c.Sig)
	if err != nil || !ed25519.Verify(pub, c.body(), sig) {
		return fmt.Errorf("%w with key %s (signed as %s)", ErrForged, KeyID(pub), c.Key)
	}
	return nil
}

func (c *Checkpoint) checkListing() error {
	if c.V >= Version && c.ListingHash() != c.Listing {
		return fmt.Errorf("%w (sequences %d..%d)", ErrListing, c.First, c.Last)
	}
	return nil
}

func (c *Checkpoint) wellFormed() error {
	if err := c.headWellFormed(); err != nil {
		return err
	}
	if n := c.Size(); uint64(len(c.IDs)) != n || uint64(len(c.Tenants)) != n {
		return fmt.Errorf("%w: %d ids and %d tenants for %d events", ErrMalformed, len(c.IDs), len(c.Tenants), n)
	}
	if l, err := base64.StdEncoding.DecodeString(c.Leaves); err != nil || uint64(len(l)) != c.Size()*prefixLen {
		return fmt.Errorf("%w: leaves", ErrMalformed)
	}
	return nil
}

// headWellFormed checks what a head holds.
func (c *Checkpoint) headWellFormed() error {
	n := c.Size()
	switch {
	case c.V != Version && c.V != VersionListed && c.V != VersionUnattested:
		return fmt.Errorf("%w: version %d", ErrMalformed, c.V)
	case c.V == VersionUnattested && len(c.Foreign) > 0:
		return fmt.Errorf("%w: version %d lists foreign events", ErrMalformed, c.V)
	case c.V < Version && c.Listing != "":
		return fmt.Errorf("%w: version %d has a listing hash", ErrMalformed, c.V)
	case c.V >= Version && len(c.Listing) != 2*sha256.Size:
		return fmt.Errorf("%w: listing hash", ErrMalformed)
	case c.First == 0 || n == 0 || n > MaxEvents:
		return fmt.Errorf("%w: range %d..%d", ErrMalformed, c.First, c.Last)
	}
	if _, err := c.root(); err != nil {
		return err
	}
	for i, seq := range c.Foreign {
		if seq < c.First || seq > c.Last || i > 0 && seq <= c.Foreign[i-1] {
			return fmt.Errorf("%w: foreign sequence %d", ErrMalformed, seq)
		}
	}
	if c.Prev != "" {
		if b, err := hex.DecodeString(c.Prev); err != nil || len(b) != sha256.Size {
			return fmt.Errorf("%w: prev", ErrMalformed)
		}
	}
	return nil
}

func (c *Checkpoint) root() (Hash, error) {
	var h Hash
	b, err := hex.DecodeString(c.Root)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("%w: root", ErrMalformed)
	}
	copy(h[:], b)
	return h, nil
}

// leafPrefix is the listed prefix of leaf i (0-based), or nil.
func (c *Checkpoint) leafPrefix(i uint64) []byte {
	l, err := base64.StdEncoding.DecodeString(c.Leaves)
	if err != nil || (i+1)*prefixLen > uint64(len(l)) {
		return nil
	}
	return l[i*prefixLen : (i+1)*prefixLen]
}

// Attested reports whether the checkpoint says which of its events are
// audit's (version 2 and later).
func (c *Checkpoint) Attested() bool { return c.V >= VersionListed }

// MaxEvents bounds the events of one checkpoint (its listed ids must fit a
// NATS message).
const MaxEvents = 4096

// KeyID names a public key as audit-chain.pub writes it (N…).
func KeyID(pub ed25519.PublicKey) string {
	b, err := nkeys.Encode(nkeys.PrefixByteServer, pub)
	if err != nil {
		return ""
	}
	return string(b)
}

// tenantOf is the tenant token of an audit subject (audit.<tenant>.…).
func tenantOf(subject string) string {
	t, _ := subjects.TenantOfAudit(subject)
	return t
}

// ceHead is how the CloudEvents SDK's encoder, which writes every event
// toolgate publishes, begins an event: the id is read from there without
// decoding the rest.
var ceHead = []byte(`{"specversion":"1.0","id":"`)

// eventID reads the CloudEvent id of an event's bytes; "" when it has none.
func eventID(data []byte) string {
	if rest, ok := bytes.CutPrefix(data, ceHead); ok {
		if end := bytes.IndexByte(rest, '"'); end >= 0 && bytes.IndexByte(rest[:end], '\\') < 0 {
			return string(rest[:end])
		}
	}
	var e struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(data, &e) != nil {
		return ""
	}
	return e.ID
}
