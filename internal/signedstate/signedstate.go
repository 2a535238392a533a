// Package signedstate checks that state which changes what a call may do
// was put there by an operator: a record kept in a bucket carries the
// operator's signed request that made it (api.DecisionProof, as
// busauth.Signer signs requests), and a reader honours the record only when
// that signature verifies as an operator's of this deployment and the
// request asked for exactly what the record holds. The right to write the
// bucket then grants nothing by itself: a leaked credential that may write
// it cannot sign as an operator.
package signedstate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/busauth"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// Verify checks a stored signed request as of the time it was signed: it
// returns the operator that signed it ("operator:<name>"), or an error
// when it is not an operator's signature of this deployment.
type Verify func(p *api.DecisionProof) (who string, err error)

// ErrUnsigned is returned for a record that carries no signed request.
var ErrUnsigned = errors.New("the record carries no operator's signed request")

// Policy checks a pushed policy bundle: signed by an operator on the
// policy push endpoint, by the operator it names, for exactly its modules
// and data.
func Policy(b kvstore.PolicyBundle, verify Verify) error {
	var r api.PolicyPushRequest
	subject := subjects.SvcPolicyPush
	if b.Proof != nil && b.Proof.Subject == subjects.SvcPolicyShadowPromote {
		subject = subjects.SvcPolicyShadowPromote // a candidate made live
	}
	if err := signedRequest(b.Proof, subject, b.PushedBy, verify, &r); err != nil {
		return err
	}
	if !same(r.Modules, b.Modules) || !same(r.Data, b.Data) {
		return errors.New("the bundle's modules or data are not the ones the operator pushed")
	}
	return nil
}

// Hooks checks a tenant's pushed hook set: signed by an operator on the
// hooks push endpoint, by the operator it names, for exactly its tenant
// and document.
func Hooks(set kvstore.HookSet, verify Verify) error {
	var r api.HooksPushRequest
	if err := signedRequest(set.Proof, subjects.SvcHooksPush, set.PushedBy, verify, &r); err != nil {
		return err
	}
	if r.TenantID != set.Tenant || !sameJSON(r.Doc, set.Doc) {
		return errors.New("the hook set's tenant or document is not the one the operator pushed")
	}
	return nil
}

// Tool checks a stored tool manifest: signed by an operator on the
// register endpoint, by the operator it names, for exactly its manifest.
// The store stamps lifecycle.created_at and updated_at into what it keeps,
// so the signed manifest is compared, in toolgate's form, with those two
// stamped in.
func Tool(rec kvstore.ToolRecord, verify Verify) error {
	var r api.RegisterRequest
	if err := signedRequest(rec.Proof, subjects.SvcToolsRegister, rec.RegisteredBy, verify, &r); err != nil {
		return err
	}
	var stored struct {
		Lifecycle struct {
			CreatedAt time.Time `json:"created_at"`
			UpdatedAt time.Time `json:"updated_at"`
		} `json:"lifecycle"`
	}
	if err := json.Unmarshal(rec.Manifest, &stored); err != nil {
		return fmt.Errorf("the stored manifest does not decode: %w", err)
	}
	// The store keeps the manifest in toolgate's form, the operator may
	// have signed it in the specification's.
	native, err := tools.Native(r.Manifest)
	if err != nil {
		return fmt.Errorf("the signed manifest does not convert: %w", err)
	}
	signed, err := kvstore.StampLifecycle(native, stored.Lifecycle.CreatedAt, stored.Lifecycle.UpdatedAt)
	if err != nil || !sameDoc(signed, rec.Manifest) {
		return errors.New("the stored manifest is not the one the operator registered")
	}
	if rec.Removal == nil {
		return nil
	}
	// A removal is honoured only as an operator's signed delete of exactly
	// this version: the control role's write access alone removes nothing.
	var d api.ToolRequest
	if err := signedRequest(rec.Removal.Proof, subjects.SvcToolsDelete, rec.Removal.By, verify, &d); err != nil {
		return fmt.Errorf("the removal: %w", err)
	}
	var id struct{ ID, Version string }
	if err := json.Unmarshal(rec.Manifest, &id); err != nil || d.ToolID != id.ID || d.Version != id.Version {
		return errors.New("the removal is not the operator's delete of this version")
	}
	return nil
}

// Model checks a stored model catalogue entry or routing policy (key
// modelrouter.RoutingKey): signed by an operator on the models register
// or policy endpoint, by the operator it names, for exactly its model (as
// the catalogue decodes it, defaults filled) or Rego.
func Model(rec kvstore.ModelRecord, key string, verify Verify) error {
	if key == modelrouter.RoutingKey {
		var r api.RoutingPolicyRequest
		if err := signedRequest(rec.Proof, subjects.SvcModelsPolicy, rec.By, verify, &r); err != nil {
			return err
		}
		if rec.Rego == nil || *rec.Rego != r.Rego || (r.Reset && r.Rego != "") {
			return errors.New("the stored routing policy is not the one the operator pushed")
		}
		return nil
	}
	var r api.ModelRequest
	if err := signedRequest(rec.Proof, subjects.SvcModelsRegister, rec.By, verify, &r); err != nil {
		return err
	}
	signed, err1 := modelrouter.Decode(r.Model)
	stored, err2 := modelrouter.Decode(rec.Model)
	if err1 != nil || err2 != nil || !same(signed, stored) || subjects.Token(stored.Name) != key {
		return errors.New("the stored model is not the one the operator registered")
	}
	return nil
}

// Breaker checks a forced breaker state, or the release of one (Forced
// false): signed by an operator on the breakers.set endpoint, by the
// operator it names, for exactly its key and state ("" for a release).
// It returns when the operator signed, for a reader to refuse a replayed
// older request.
func Breaker(st kvstore.BreakerState, verify Verify) (time.Time, error) {
	var r api.BreakerSetRequest
	if err := signedRequest(st.Proof, subjects.SvcBreakersSet, st.By, verify, &r); err != nil {
		return time.Time{}, err
	}
	want := api.BreakerRelease
	if st.Forced {
		want = st.State
	}
	if r.Key != st.Key || r.State != want {
		return time.Time{}, errors.New("the breaker's key or forced state is not the one the operator set")
	}
	return SignedAt(st.Proof), nil
}

// SignedAt is when a signed request was signed (zero if it does not say).
func SignedAt(p *api.DecisionProof) time.Time {
	if p == nil {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(nats.Header(p.Headers).Get(busauth.HeaderSignedAt), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// sameDoc compares two JSON documents by value: member order and spacing
// aside, numbers compared as written.
func sameDoc(a, b []byte) bool {
	ca, err1 := canonical(a)
	cb, err2 := canonical(b)
	return err1 == nil && err2 == nil && bytes.Equal(ca, cb)
}

func canonical(doc []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errors.New("trailing data")
	}
	return json.Marshal(v)
}

// signedRequest checks that p is a request to subject signed by the
// operator by, and decodes its body into req for the caller to compare
// with the record.
func signedRequest(p *api.DecisionProof, subject, by string, verify Verify, req any) error {
	if p == nil {
		return ErrUnsigned
	}
	if p.Subject != subject {
		return fmt.Errorf("the signed request went to %q, not %s", p.Subject, subject)
	}
	who, err := verify(p)
	if err != nil {
		return err
	}
	if who != by {
		return fmt.Errorf("signed by %s, recorded as pushed by %s", who, by)
	}
	if err := json.Unmarshal(p.Body, req); err != nil {
		return fmt.Errorf("the signed request to %s does not decode: %w", subject, err)
	}
	return nil
}

// sameJSON compares two JSON texts by their compacted forms.
func sameJSON(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// same compares two values by their JSON encodings (maps encode with
// sorted keys).
func same(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// Refused is the data of the audit event of a record a reader ignored.
type Refused struct {
	// What names the state: "policy".
	What     string `json:"what"`
	Revision uint64 `json:"revision"`
	Reason   string `json:"reason"`
	// By names the process that ignored it ("urn:toolgate:authorize").
	By string `json:"by"`
}

// RefusedEvent is the audit event (api.TypeStateRefused, on
// audit._system.state.refused) of a record source ignored. Every reader
// that ignores the same revision writes the same event id, so the audit
// stream's duplicate window keeps one.
func RefusedEvent(source, what string, revision uint64, cause error) (stages.Output, error) {
	e := event.New()
	e.SetID(fmt.Sprintf("state-refused-%s-%d-%s", what, revision, strings.TrimPrefix(source, "urn:toolgate:")))
	e.SetSource(source)
	e.SetType(api.TypeStateRefused)
	e.SetTime(time.Now().UTC())
	if err := e.SetData(event.ApplicationJSON, Refused{What: what, Revision: revision, Reason: cause.Error(), By: source}); err != nil {
		return stages.Output{}, err
	}
	return stages.EventOutput(subjects.AuditEvent(subjects.SystemTenant, envelope.SubjectSuffix(api.TypeStateRefused)), &e)
}

// ShadowPolicy checks a candidate policy: signed by an operator on the
// shadow push endpoint, by the operator it names, for exactly its modules
// and data.
func ShadowPolicy(b kvstore.PolicyBundle, verify Verify) error {
	var r api.PolicyPushRequest
	if err := signedRequest(b.Proof, subjects.SvcPolicyShadowPush, b.PushedBy, verify, &r); err != nil {
		return err
	}
	if !same(r.Modules, b.Modules) || !same(r.Data, b.Data) {
		return errors.New("the candidate's modules or data are not the ones the operator pushed")
	}
	return nil
}

// Revocation checks a token's revocation: signed by an operator on the
// revoke endpoint, by the operator it names, for exactly this token id
// and until. The control role may write the revocations bucket, so
// without this its credential alone could revoke any agent's token.
func Revocation(rec kvstore.Revocation, jti string, verify Verify) error {
	var r api.RevokeRequest
	if err := signedRequest(rec.Proof, subjects.SvcTokensRevoke, rec.RevokedBy, verify, &r); err != nil {
		return err
	}
	if r.JTI != jti || !r.Until.Equal(rec.Until) {
		return errors.New("the revocation's token or until is not the one the operator revoked")
	}
	return nil
}
