// Package seal signs the authorize stage's decision into the invocation
// envelope and checks it before a tool runs: defence in depth beneath the
// bus's subject permissions. A hop published straight onto the execute
// subject, or one whose tool, parameters, grants or budget keys were
// changed after authorize, carries no seal that verifies, and execute
// refuses it (E3218) whatever credentials published it.
//
// The seal is an Ed25519 signature by the deployment's hop-sealing key
// (busauth.LoadOrCreateSealKey: seal.nk for authorize, seal.pub for
// execute) over tenant, invocation id, ingest sequence, tool id and
// version, the digest of the request (parameters, agent context, limits,
// options), the digest of the authorization (token, grants, budget keys,
// approver), the decision, an expiry and the digest of the principal
// authorize verified (envelope.PrincipalText). One signature per admitted
// call, one verification per run: the principal needs none of its own.
package seal

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
)

// DecisionAllow is the only decision a seal carries: authorize seals the
// calls it admits.
const DecisionAllow = "allow"

// version prefixes the signed text, so a later layout cannot be confused
// with this one. A seal that covers the call's principal is signed as
// versionPrincipal, with the principal's digest last; one without (made
// before seals covered it) keeps the first layout and still verifies.
const (
	version          = "toolgate-seal-v1"
	versionPrincipal = "toolgate-seal-v2"
)

// Sealer signs decisions with the private sealing key.
type Sealer struct {
	key  ed25519.PrivateKey
	pub  ed25519.PublicKey
	id   string
	made *memory[envelope.Seal] // the seals it made, by signature, for a Verifier of the same process
}

// NewSealer returns a Sealer for key.
func NewSealer(key ed25519.PrivateKey) *Sealer {
	pub := key.Public().(ed25519.PublicKey)
	return &Sealer{key: key, pub: pub, id: busauth.SealKeyID(pub), made: new(memory[envelope.Seal])}
}

// Verifier returns a Verifier for s's key that accepts the seals s made
// without verifying their signatures again (authorize and execute in one
// process): a seal equal, field by field, to one s signed is that
// signature's text, which verifies by construction.
func (s *Sealer) Verifier() *Verifier {
	v := NewVerifier(s.Public())
	v.made = s.made
	return v
}

// Public returns the public key that verifies this Sealer's seals.
func (s *Sealer) Public() ed25519.PublicKey { return s.pub }

// Seal signs inv's authorization, which must be set and final: the request
// as it will be handed on (no capability token), the resolved tool id and
// version, and expires (the token's expiry).
func (s *Sealer) Seal(inv *envelope.Invocation, toolID, toolVersion string, expires time.Time) error {
	if inv.Authz == nil || inv.Request == nil {
		return errors.New("seal: invocation has no authorization or request")
	}
	inv.Authz.Seal = nil
	sl := &envelope.Seal{
		Key: s.id, Tenant: inv.Tenant, ID: inv.ID, Seq: inv.Event.Seq,
		ToolID: toolID, ToolVersion: toolVersion, Decision: DecisionAllow, Expires: expires.UnixMilli(),
	}
	var err error
	if sl.Request, err = digest(inv.Request); err != nil {
		return err
	}
	if sl.Authz, err = digest(inv.Authz); err != nil {
		return err
	}
	if inv.Principal != nil {
		sl.Principal = principalDigest(inv)
	}
	var buf [sealTextMax]byte
	text := appendSigned(buf[:0], sl)
	sig := ed25519.Sign(s.key, text)
	var enc [sigEncoded]byte
	base64.RawURLEncoding.Encode(enc[:], sig)
	sl.Sig = string(enc[:])
	s.made.remember(sl.Sig, *sl, len(text)+len(sl.Sig))
	inv.Authz.Seal = sl
	return nil
}

// Verifier checks seals with the public sealing key.
type Verifier struct {
	key  ed25519.PublicKey
	id   string
	made *memory[envelope.Seal] // its Sealer's, in the same process
}

// NewVerifier returns a Verifier for key.
func NewVerifier(key ed25519.PublicKey) *Verifier {
	return &Verifier{key: key, id: busauth.SealKeyID(key)}
}

// Check returns nil when inv carries a seal of this deployment that
// verifies and names exactly this invocation, the tool route chose, this
// request and this authorization, and has not expired at now. Otherwise it
// returns a permission_denied *api.Error (E3218) naming what is wrong, with
// details.sealed_field set when a sealed field was changed.
func (v *Verifier) Check(inv *envelope.Invocation, now time.Time) error {
	if inv.Authz == nil || inv.Authz.Seal == nil {
		return refuse("the hop carries no authorization seal: it was not handed on by the authorize stage", "")
	}
	sl := inv.Authz.Seal
	if sl.Key != v.id {
		return refuse("the seal is signed by key "+sl.Key+", not this deployment's hop-sealing key "+v.id, "key")
	}
	var buf [sealTextMax]byte
	if !v.ours(sl) && !v.signatureGood(sl, buf[:0]) {
		return refuse("the seal's signature does not verify: forged or altered", "sig")
	}
	route := inv.Route
	if route == nil {
		return refuse("the hop carries no route", "")
	}
	switch {
	case sl.Tenant != inv.Tenant:
		return refuse("the seal is for tenant "+strconv.Quote(sl.Tenant)+", the hop is for "+strconv.Quote(inv.Tenant), "tenant")
	case sl.ID != inv.ID:
		return refuse("the seal is for invocation "+strconv.Quote(sl.ID)+", the hop is "+strconv.Quote(inv.ID), "id")
	case sl.Seq != inv.Event.Seq:
		return refuse("the seal is for ingest sequence "+strconv.FormatUint(sl.Seq, 10)+", the hop's is "+strconv.FormatUint(inv.Event.Seq, 10), "seq")
	case sl.ToolID != route.ToolID || sl.ToolVersion != route.ToolVersion:
		return refuse("the seal is for "+sl.ToolID+"@"+sl.ToolVersion+", the hop runs "+route.ToolID+"@"+route.ToolVersion, "tool")
	case sl.Decision != DecisionAllow:
		return refuse("the sealed decision is "+strconv.Quote(sl.Decision), "decision")
	case now.UnixMilli() > sl.Expires:
		return refuse("the seal expired at "+time.UnixMilli(sl.Expires).UTC().Format(time.RFC3339), "exp")
	}
	if !digestIs(inv.Request, sl.Request) {
		return refuse("the request (parameters, agent context, limits or options) differs from the one authorize sealed", "request")
	}
	// The digest is of the authorization without its seal: of a copy, so
	// a reader of inv meanwhile never sees it unsealed.
	a := *inv.Authz
	a.Seal = nil
	if !digestIs(&a, sl.Authz) {
		return refuse("the authorization (token, grants, budget keys or approver) differs from the one authorize sealed", "authz")
	}
	return nil
}

// Principal reports whether sl is a seal of this deployment, its
// signature good, made for inv (tenant and id) with inv's principal: what
// authorize verified, which no later hop changed. Its expiry does not
// count: a hook's child or a re-drive may start after the token expired,
// and is judged again by authorize.
func (v *Verifier) Principal(inv *envelope.Invocation, sl *envelope.Seal) bool {
	if sl == nil || inv.Principal == nil || sl.Principal == "" || sl.Key != v.id || sl.Tenant != inv.Tenant || sl.ID != inv.ID {
		return false
	}
	var buf [sealTextMax]byte
	return v.signatureGood(sl, buf[:0]) && sl.Principal == principalDigest(inv)
}

// ours reports whether sl is, byte for byte, a seal v's Sealer made,
// forgetting it: a redelivery, or a seal altered in any field, is
// verified.
func (v *Verifier) ours(sl *envelope.Seal) bool {
	if v.made == nil {
		return false
	}
	m, ok := v.made.take(sl.Sig)
	if !ok {
		return false
	}
	same, theirs := m.Seq == sl.Seq && m.Expires == sl.Expires, quoted(sl)
	for i, f := range quoted(&m) {
		same = EqualSecret(f, theirs[i]) && same
	}
	return EqualSecret(m.Principal, sl.Principal) && EqualSecret(m.Sig, sl.Sig) && same
}

// signatureGood reports whether sl's signature verifies, building its
// text in buf (the caller's, on its stack).
func (v *Verifier) signatureGood(sl *envelope.Seal, buf []byte) bool {
	var sig [ed25519.SignatureSize]byte
	if base64.RawURLEncoding.EncodedLen(len(sig)) != len(sl.Sig) {
		return false
	}
	n, err := base64.RawURLEncoding.Decode(sig[:], []byte(sl.Sig))
	// A recent that remembers nothing verifies, on copies: buf stays on
	// the stack.
	var long *recent
	return err == nil && n == len(sig) && long.verified(v.key, appendSigned(buf, sl), sig[:])
}

// principalDigest is the SHA-256 (hex) of inv's principal text.
func principalDigest(inv *envelope.Invocation) string {
	return hexSum(sha256.Sum256(envelope.PrincipalText(inv)))
}

// digestIs reports whether want is digest(v), comparing the sums rather
// than their hex: no string made per check.
func digestIs(v any, want string) bool {
	b, err := envelope.Marshal(v)
	if err != nil {
		return false
	}
	sum := sha256.Sum256(b)
	var got [sha256.Size * 2]byte
	hex.Encode(got[:], sum[:])
	return string(got[:]) == want // no allocation to compare
}

func refuse(msg, field string) error {
	e := api.NewError(api.PermissionDenied, api.EHopUnsealed, "execute refused the call: %s", msg)
	if field != "" {
		e = e.WithDetail("sealed_field", field)
	}
	return e
}

// digest is the SHA-256 (hex) of v's JSON encoding. Every field of the
// request and the authorization is a struct field, a slice or a raw JSON
// value that encoding/json writes compacted, so the encoding a later hop
// recomputes after decoding the envelope is the same bytes; envelope.Marshal
// writes encoding/json's bytes, so builds of either encoder agree.
func digest(v any) (string, error) {
	b, err := envelope.Marshal(v)
	if err != nil {
		return "", err
	}
	return hexSum(sha256.Sum256(b)), nil
}

// hexSum is hex.EncodeToString(sum[:]) in one allocation, the string's.
func hexSum(sum [sha256.Size]byte) string {
	var text [2 * sha256.Size]byte
	hex.Encode(text[:], sum[:])
	return string(text[:])
}

// signed is the text the signature covers: each field on its own line,
// the strings quoted, so no value can run into the next.
func signed(s *envelope.Seal) []byte { return appendSigned(make([]byte, 0, 400), s) }

// sealTextMax fits the signed text of a seal with ids and tool names of
// common lengths, so it is built on the stack; a longer one is still built.
const sealTextMax = 512

// appendSigned appends signed's text to b.
func appendSigned(b []byte, s *envelope.Seal) []byte {
	if s.Principal == "" {
		b = append(b, version...)
	} else {
		b = append(b, versionPrincipal...)
	}
	for _, f := range quoted(s) {
		b = strconv.AppendQuote(append(b, '\n'), f)
	}
	b = strconv.AppendUint(append(b, '\n'), s.Seq, 10)
	b = strconv.AppendInt(append(b, '\n'), s.Expires, 10)
	if s.Principal != "" {
		b = strconv.AppendQuote(append(b, '\n'), s.Principal)
	}
	return b
}

// quoted is the seal's string fields the signed text quotes, in order.
func quoted(s *envelope.Seal) [8]string {
	return [...]string{s.Key, s.Tenant, s.ID, s.ToolID, s.ToolVersion, s.Request, s.Authz, s.Decision}
}
