package auditchain

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sync"

	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
)

// receiptDomain starts what a receipt's signature covers, so that no
// receipt signature can be taken for a checkpoint's (whose signed body
// starts with "{") under the same key, nor the other way round.
const receiptDomain = "toolgate-receipt-v1\n"

// ReceiptSigner signs receipts with the chain key: what verifiers hold
// of audit is audit-chain.pub, so receipts and checkpoints check with the
// same public key.
type ReceiptSigner struct {
	key ed25519.PrivateKey
	id  string // KeyID of the public half, encoded once
}

// NewReceiptSigner returns a signer with the chain key k.
func NewReceiptSigner(k ed25519.PrivateKey) *ReceiptSigner {
	return &ReceiptSigner{key: k, id: KeyID(k.Public().(ed25519.PublicKey))}
}

// Sign sets r's Key and Sig: one Ed25519 signature.
func (s *ReceiptSigner) Sign(r *api.Receipt) { bodies.Put(s.sign(r)) }

// sign is Sign, returning the body it signed (put it back in bodies).
func (s *ReceiptSigner) sign(r *api.Receipt) *[]byte {
	r.Key, r.Sig = s.id, ""
	b := receiptBody(r)
	r.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(s.key, *b))
	return b
}

// bodies are the buffers receipt bodies are encoded into.
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// receiptBody is what is signed: the domain and r's JSON without Sig
// (strings, numbers and a DecisionProof, whose map encodes in key order,
// so a decoded receipt encodes to the same bytes). Put it back in bodies.
func receiptBody(r *api.Receipt) *[]byte {
	rc := *r
	rc.Sig = ""
	b := bodies.Get().(*[]byte)
	// json.Marshal's bytes, which every build signed, written by the
	// segmentio codec, several times faster: it writes them alike for a
	// receipt's types, which hold no omitzero, the one thing it writes
	// otherwise (envelope.Marshal; FuzzReceiptEncodesAsMarshal).
	out, err := segjson.Append(append((*b)[:0], receiptDomain...), &rc, segjson.EscapeHTML|segjson.SortMapKeys)
	if err != nil {
		buf := bytes.NewBuffer(append((*b)[:0], receiptDomain...))
		_ = json.NewEncoder(buf).Encode(&rc) // cannot fail on these types
		out = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	*b = out
	return b
}

// Digest is the SHA-256 (hex) receipts name parameters and results by:
// of raw as compact JSON (encoding/json's Compact), so that insignificant
// whitespace, which JSON encoders along the way drop, does not change it.
// Empty (or JSON null) raw has the empty digest.
func Digest(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	if !compact(raw) {
		var c bytes.Buffer
		c.Grow(len(raw))
		if err := json.Compact(&c, raw); err == nil {
			raw = c.Bytes()
		} // else not JSON: its bytes as they are
	}
	return hexSum(sha256.Sum256(raw))
}

// hexSum is hex.EncodeToString(sum[:]) in one allocation, the string's.
func hexSum(sum [sha256.Size]byte) string {
	var text [2 * sha256.Size]byte
	hex.Encode(text[:], sum[:])
	return string(text[:])
}

// compact reports whether raw holds no whitespace outside its strings, so
// that json.Compact would return it as it is (or, not JSON, Digest hashes
// it as it is): the values audit hashes have crossed the bus, whose
// encoders drop whitespace, so this scan, without a copy, is the usual
// path.
func compact(raw []byte) bool {
	in, esc := false, false
	for _, c := range raw {
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// CheckReceipt verifies r's signature with pub (E3960).
func CheckReceipt(r *api.Receipt, pub ed25519.PublicKey) error {
	if r == nil || r.V < 1 || r.V > api.ReceiptVersion || r.InvocationID == "" || r.EventID == "" {
		return api.NewError(api.InvalidParameters, api.EReceiptMalformed, "not a receipt (version %d)", receiptVersion(r))
	}
	sig, err := base64.StdEncoding.DecodeString(r.Sig)
	b := receiptBody(r)
	defer bodies.Put(b)
	if err != nil || !ed25519.Verify(pub, *b, sig) {
		return api.NewError(api.PermissionDenied, api.EReceiptForged,
			"the receipt of %s does not verify with key %s (signed as %s): it was changed, or another key signed it", r.InvocationID, KeyID(pub), r.Key)
	}
	return nil
}

func receiptVersion(r *api.Receipt) int {
	if r == nil {
		return 0
	}
	return r.V
}

// CheckReceiptResult checks that result (the response's result member, as
// returned) is the one r names (E3961).
func CheckReceiptResult(r *api.Receipt, result []byte) error {
	if got := Digest(result); got != r.ResultSHA256 {
		return api.NewError(api.InvalidParameters, api.EReceiptResult,
			"the result given (sha256 %s) is not the one the receipt of %s names (sha256 %s)", orNone(got), r.InvocationID, orNone(r.ResultSHA256))
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// CheckReceiptProof checks that p proves r in the trail (E3962): p checks
// with pub (the checkpoint's signature and the path to its root), it is
// the proof of r's terminal event, and that event carries r itself.
func CheckReceiptProof(r *api.Receipt, p *Proof, pub ed25519.PublicKey) error {
	refuseAs := func(code, format string, args ...any) error {
		return api.NewError(api.PermissionDenied, code, "the proof does not prove the receipt of %s: "+format,
			append([]any{r.InvocationID}, args...)...)
	}
	refuse := func(format string, args ...any) error { return refuseAs(api.EReceiptProof, format, args...) }
	if p == nil {
		return refuse("there is none")
	}
	if err := p.Check(pub); err != nil {
		// Which part failed has its own code: the signed head, the
		// listing beside it, or the path from the event to the root.
		switch {
		case errors.Is(err, ErrForged):
			return refuseAs(api.EReceiptHeadForged, "its checkpoint was changed, or another key signed it: %v", err)
		case errors.Is(err, ErrListing):
			return refuseAs(api.EReceiptListing, "%v", err)
		case errors.Is(err, ErrProof):
			return refuseAs(api.EReceiptTree, "its event and path do not lead to its checkpoint's root (a proof for another tree): %v", err)
		}
		return refuse("%v", err)
	}
	var ev struct {
		ID   string `json:"id"`
		Data struct {
			Receipt *api.Receipt `json:"receipt"`
		} `json:"data"`
	}
	if err := json.Unmarshal(p.Data, &ev); err != nil {
		return refuse("its event is not a CloudEvent: %v", err)
	}
	if p.EventID != r.EventID || ev.ID != r.EventID {
		return refuse("it proves event %s, the receipt names %s", p.EventID, r.EventID)
	}
	got := ev.Data.Receipt
	if got == nil || got.Sig != r.Sig {
		return refuse("event %s (seq %d) carries another receipt", r.EventID, p.Seq)
	}
	a, b := receiptBody(got), receiptBody(r)
	defer bodies.Put(a)
	defer bodies.Put(b)
	if !bytes.Equal(*a, *b) {
		return refuse("event %s (seq %d) carries another receipt", r.EventID, p.Seq)
	}
	return nil
}

// Public is the public half of the signer's key.
func (s *ReceiptSigner) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// HeaderSeal, set to SealReceipt, marks a result message whose receipt
// is its signature (SealResult): the publisher adds no signature of its
// own, and a reader checks the receipt (seal.Messages).
const (
	HeaderSeal  = "Toolgate-Seal"
	SealReceipt = "receipt"
)

// receiptMember is how a result message's data names its receipt: the
// Response's last member.
const receiptMember = `,"receipt":`

// SealResult is the one signature of a result message with a receipt:
// msg is the message as published but without the receipt, the
// Response (its CloudEvent data) closing at msg[end]. It names msg in r
// (Ending), signs r, and returns msg with r as the Response's last
// member, so that r's signature proves the message and the receipt alike
// (OpenResult).
func (s *ReceiptSigner) SealResult(r *api.Receipt, msg []byte, end int) ([]byte, error) {
	r.V, r.Ending = api.ReceiptVersion, endingDigest(msg)
	b := s.sign(r)
	defer bodies.Put(b)
	obj := (*b)[len(receiptDomain) : len(*b)-1]
	return carryParts(msg, end, obj, `,"sig":"`, r.Sig, `"}`)
}

// CarryReceipt returns msg with r, signed already, as the last member of
// the object that closes at msg[end].
func CarryReceipt(msg []byte, end int, r *api.Receipt) ([]byte, error) {
	rb, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return carry(msg, end, rb)
}

// carry is CarryReceipt of the receipt encoded as rb.
func carry(msg []byte, end int, rb []byte) ([]byte, error) {
	return carryParts(msg, end, rb, "", "", "")
}

// carryParts is carry of the receipt encoded as obj and the rest, in one
// allocation. SealResult gives json.Marshal of the receipt whose body
// (receiptBody) was signed, as the body's JSON without its closing brace
// (obj) and the signature as its last member, as Sig is the receipt's last
// field: the receipt is encoded once. Base64 holds nothing encoding/json
// escapes.
func carryParts(msg []byte, end int, obj []byte, rest ...string) ([]byte, error) {
	if end <= 0 || end >= len(msg) || msg[end] != '}' {
		return nil, errors.New("no object closes where the receipt goes")
	}
	n := len(msg) + len(receiptMember) + len(obj)
	for _, r := range rest {
		n += len(r)
	}
	out := make([]byte, 0, n)
	out = append(append(append(out, msg[:end]...), receiptMember...), obj...)
	for _, r := range rest {
		out = append(out, r...)
	}
	return append(out, msg[end:]...), nil
}

// EndingMatches reports whether r, signed already, names msg (the result
// message without its receipt), so that CarryReceipt may put it in again
// without a new signature (a redelivery of an ending recorded).
func EndingMatches(r *api.Receipt, msg []byte) bool {
	return r != nil && r.Ending != "" && r.Ending == endingDigest(msg)
}

func endingDigest(msg []byte) string { return hexSum(sha256.Sum256(msg)) }

// OpenResult checks a result message that carries its receipt as its
// proof (SealResult) and returns the receipt: the receipt verifies with
// pub (E3960), and names this very message, without the receipt's member
// (E3905). A message without a receipt, or whose receipt is not of
// version 2 or later, does not check.
func OpenResult(msg []byte, pub ed25519.PublicKey) (*api.Receipt, error) {
	refuse := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.EReceiptEnding, "the result message is not the one its receipt names: "+format, args...)
	}
	var ev struct {
		Data struct {
			Receipt json.RawMessage `json:"receipt"`
		} `json:"data"`
	}
	if err := json.Unmarshal(msg, &ev); err != nil {
		return nil, refuse("not a CloudEvent: %v", err)
	}
	raw := ev.Data.Receipt
	if len(raw) == 0 || string(raw) == "null" {
		return nil, refuse("it carries no receipt")
	}
	var r api.Receipt
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, refuse("its receipt does not decode: %v", err)
	}
	if err := CheckReceipt(&r, pub); err != nil {
		return nil, err
	}
	member := make([]byte, 0, len(receiptMember)+len(raw))
	member = append(append(member, receiptMember...), raw...)
	i := bytes.LastIndex(msg, member)
	if i < 0 {
		return nil, refuse("its receipt is not the last member of its data")
	}
	bare := make([]byte, 0, len(msg)-len(member))
	bare = append(append(bare, msg[:i]...), msg[i+len(member):]...)
	if r.Ending == "" || r.Ending != endingDigest(bare) {
		return nil, refuse("the receipt of %s names message %s, this one is %s", r.InvocationID, orNone(r.Ending), endingDigest(bare))
	}
	return &r, nil
}
