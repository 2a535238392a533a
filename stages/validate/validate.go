// Package validate is the first stage: it checks the envelope of a tool.invoke
// event, the request against the public schema, the tenant, and the
// parameters against the tool's input schema.
package validate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/schemas"
	"github.com/toolgate/toolgate/stages"
	"github.com/toolgate/toolgate/subjects"
)

// DefaultMaxEventBytes bounds an event (headers and body) when Config leaves it zero.
const DefaultMaxEventBytes = 1 << 20

// Config configures the validate stage.
type Config struct {
	// MaxEventBytes is the largest accepted event, headers included.
	MaxEventBytes int
	// MaxDepth and MaxStringBytes bound every request's parameters.
	MaxDepth       int
	MaxStringBytes int
	// Detectors checks the parameters a manifest marks; nil uses the shipped rules.
	Detectors *detect.Engine
	// Claims, when set, records which publish owns each invocation id, so a
	// second request that reuses an id is refused here (E3024) and never
	// mistaken for a redelivery later on.
	Claims IDClaims
	// Tokens, when set, seals the capability token of every request it
	// hands on (*seal.Tokens): only authorize, holding the same key, reads
	// it again; no other stage, stream or record sees a raw token.
	Tokens TokenSealer
}

// TokenSealer seals a raw capability token.
type TokenSealer interface {
	Seal(raw string) (string, error)
}

// IDClaims takes an invocation id for one publish (kvstore.Store).
type IDClaims interface {
	ClaimInvocation(ctx context.Context, tenant, id string, seq uint64, digest, agent, tool, version string) (rec api.Record, again bool, err error)
}

// Validator implements the validate stage.
type Validator struct {
	reg *tools.Registry
	cfg Config
}

var (
	_ stages.Stage   = (*Validator)(nil)
	_ stages.Decoder = (*Validator)(nil)
)

// New returns a Validator resolving tools in reg.
func New(reg *tools.Registry, cfg Config) *Validator {
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = DefaultMaxEventBytes
	}
	if cfg.MaxDepth <= 0 {
		cfg.MaxDepth = DefaultMaxDepth
	}
	if cfg.MaxStringBytes <= 0 {
		cfg.MaxStringBytes = DefaultMaxStringBytes
	}
	if cfg.Detectors == nil {
		cfg.Detectors = detect.Default()
	}
	return &Validator{reg: reg, cfg: cfg}
}

// Decode implements stages.Decoder: validate's input is the caller's
// CloudEvent, in binary or structured mode.
func (v *Validator) Decode(subject string, header map[string][]string, data []byte, seq uint64, now time.Time) (*envelope.Invocation, error) {
	return envelope.FromMessage(subject, header, data, seq, now)
}

// Process implements stages.Stage. Whatever it decides, the raw token does
// not leave the stage: a decoded request's is sealed, and the raw data of
// a request that was never decoded (a refusal) is dropped.
func (v *Validator) Process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	outs, err := v.process(ctx, inv)
	if v.cfg.Tokens == nil {
		return outs, err
	}
	inv.Data = nil
	if r := inv.Request; r != nil && r.CapabilityToken != "" {
		sealed, serr := v.cfg.Tokens.Seal(r.CapabilityToken)
		if serr != nil {
			r.CapabilityToken = ""
			return nil, stages.Transient(fmt.Errorf("sealing the capability token: %w", serr), 0)
		}
		r.CapabilityToken = sealed
	}
	return outs, err
}

func (v *Validator) process(ctx context.Context, inv *envelope.Invocation) ([]stages.Output, error) {
	if inv.Event.Size > v.cfg.MaxEventBytes {
		return nil, api.NewError(api.InvalidParameters, api.EPayloadTooLarge,
			"event is %d bytes, the limit is %d", inv.Event.Size, v.cfg.MaxEventBytes)
	}
	if inv.Event.Type != envelope.EventType {
		return nil, api.NewError(api.InvalidParameters, api.EWrongEventType,
			"event type %q: expected %q", inv.Event.Type, envelope.EventType)
	}
	// inv.Data is JSON: Decode (envelope.FromMessage) refused any other
	// data, and every hand-off decoder refuses a message that is not.
	fields, err := schemas.ValidateJSON(schemas.InvokeRequest(), inv.Data)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid,
			"event data is not a JSON ToolInvokeRequest: %v", err)
	}
	if len(fields) > 0 {
		return nil, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"event data does not match the ToolInvokeRequest schema").WithFields(fields)
	}
	digest := requestDigest(inv)
	var req api.Request
	if err := decodeRequest(inv.Data, &req); err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid, "decoding request: %v", err)
	}
	inv.Request, inv.Data = &req, nil
	if len(req.Parameters) == 0 {
		req.Parameters = json.RawMessage(`{}`)
	}
	if req.InvocationID != "" && req.InvocationID != inv.ID {
		return nil, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"invocation_id %q differs from the event id %q", req.InvocationID, inv.ID)
	}
	if req.AgentContext.TenantID != inv.Tenant {
		return nil, api.NewError(api.PermissionDenied, api.ETenantMismatch,
			"agent_context.tenant_id %q does not match the subject's tenant %q", req.AgentContext.TenantID, inv.Tenant)
	}
	if err := v.claim(ctx, inv, digest, req.ToolID, req.ToolVersion); err != nil {
		return nil, err
	}
	if err := checkBounds(req.Parameters, v.cfg.MaxDepth, v.cfg.MaxStringBytes); err != nil {
		return nil, err
	}
	m, err := v.reg.Resolve(req.ToolID, req.ToolVersion)
	if err != nil {
		return nil, err
	}
	fields, err = m.ValidateInput(req.Parameters)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EParametersInvalid, "parameters: %v", err)
	}
	if len(fields) > 0 {
		return nil, api.NewError(api.InvalidParameters, api.EParametersInvalid,
			"parameters do not match the input schema of %s", m.Key()).WithFields(fields)
	}
	if err := checkInputs(m, req.Parameters, v.cfg.Detectors); err != nil {
		return nil, err
	}
	if req.ExecutionOptions != nil && req.ExecutionOptions.AsyncMode {
		o, err := accepted(inv)
		return []stages.Output{o}, err
	}
	return nil, nil
}

// claim takes the invocation id for this publish. The ingest sequence, not
// the id, tells a redelivery (same sequence) from a second publish; a second
// publish of the very same event (same source and data) is answered by the
// first one's result, so its refusal carries details.same_request and audit
// publishes no result for it.
func (v *Validator) claim(ctx context.Context, inv *envelope.Invocation, digest, tool, version string) error {
	if v.cfg.Claims == nil {
		return nil
	}
	rec, again, err := v.cfg.Claims.ClaimInvocation(ctx, inv.Tenant, inv.ID, inv.Event.Seq, digest, inv.Agent(), tool, version)
	if err != nil {
		return stages.Transient(fmt.Errorf("claiming the invocation id: %w", err), 0)
	}
	if rec.Seq == inv.Event.Seq {
		inv.Again = again
		return nil
	}
	e := api.NewError(api.InvalidParameters, api.EDuplicateInvocation,
		"invocation id %q is already used in this tenant by another request", inv.ID)
	if rec.Digest == digest {
		e = e.WithDetail("same_request", true)
	}
	return e
}

// decodeRequest reads a request the schema check found to be JSON as the
// hops after validate read it again (envelope.Decode): by
// github.com/segmentio/encoding/json, several times faster to the same
// value, where its bytes are valid UTF-8; anything else, or anything that
// decoder refuses or panics on, by encoding/json, whose verdict stands.
func decodeRequest(data []byte, req *api.Request) error {
	if utf8.Valid(data) && decodeFast(data, req) {
		return nil
	}
	*req = api.Request{}
	return json.Unmarshal(data, req)
}

func decodeFast(data []byte, req *api.Request) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return segjson.Unmarshal(data, req) == nil
}

// requestDigest identifies what an event asks for: its source and its data
// exactly as sent (the capability token included).
func requestDigest(inv *envelope.Invocation) string {
	h := sha256.New()
	h.Write([]byte(inv.Event.Source))
	h.Write([]byte{0})
	h.Write(inv.Data)
	// On the stack but the string itself (hex.EncodeToString makes three).
	var sum [sha256.Size]byte
	var text [2 * sha256.Size]byte
	return string(hex.AppendEncode(text[:0], h.Sum(sum[:0])))
}

// accepted is the immediate answer to an async_mode request: a pending
// response on the result subject that says where to poll. The terminal
// result follows on the same subject.
func accepted(inv *envelope.Invocation) (stages.Output, error) {
	resp := api.Response{InvocationID: inv.ID, Status: api.StatusPending,
		PollingInfo: &api.PollingInfo{ResultSubject: subjects.Result(inv.Tenant, inv.Agent(), inv.ID), StatusSubject: subjects.TenantSvc(inv.Tenant, subjects.SvcStatus)}}
	o, _, err := stages.InvocationEvent(subjects.Result(inv.Tenant, inv.Agent(), inv.ID), inv, "urn:toolgate:"+subjects.Validate,
		api.TypeAccepted, resp, time.Now().UTC())
	o.MsgID = inv.MsgID("accepted")
	return o, err
}
