package stages

import (
	"bytes"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// SweptDetail marks, in an E3901 error's details, an ending the sweep of
// left-behind messages decided (not JetStream's advisory): audit refuses it
// over a record a live worker holds (parked or running).
const SweptDetail = "swept"

// Swept reports an ending the sweep made (E3901 with SweptDetail).
func Swept(e *api.Error) bool {
	if e == nil || e.ECode != api.EDeliveryExhausted {
		return false
	}
	s, _ := e.Details[SweptDetail].(bool)
	return s
}

// EventOutput encodes e in structured mode, so that `nats sub` shows the
// whole CloudEvent, with its source and id as message id.
func EventOutput(subject string, e *event.Event) (Output, error) {
	// The SDK's own encoder writes compact JSON: json.Marshal would only
	// scan it again.
	data, err := e.MarshalJSON()
	if err != nil {
		return Output{}, err
	}
	return EncodedEventOutput(subject, envelope.MsgID(e.Source(), e.ID()), data), nil
}

// EncodedEventOutput is EventOutput for a CloudEvent encoded already, in
// structured mode.
func EncodedEventOutput(subject, msgID string, data []byte) Output {
	return Output{Subject: subject, MsgID: msgID, Header: map[string][]string{"Content-Type": cloudEventsJSON}, Data: data}
}

// cloudEventsJSON is every event's Content-Type, one slice for all: a
// header's values are replaced or appended to (its capacity is its
// length, so an append copies), never written in place.
var cloudEventsJSON = []string{event.ApplicationCloudEventsJSON}[:1:1]

// AuditEvent is the audit CloudEvent of type typ about inv, published by
// stage. Its message id is unique per accepted publish and type.
func AuditEvent(stage string, inv *envelope.Invocation, typ string, data any) (Output, error) {
	suffix := envelope.SubjectSuffix(typ)
	o, _, err := InvocationEvent(subjects.AuditEvent(inv.Tenant, suffix), inv, "urn:toolgate:"+stage, typ, data, time.Now().UTC())
	o.MsgID = inv.MsgID("audit." + suffix)
	return o, err
}

// InvocationEvent is the CloudEvent inv.NewEvent(source, typ, data) makes,
// of time at (zero: none), as EventOutput publishes it on subject, but
// without a message id (the caller names it after the invocation), and
// the index in its bytes of the last byte of its data (data that is
// encoded to JSON, not []byte, which the SDK writes in base64).
//
// Every call publishes several such events: they are written here
// directly, to the bytes the SDK's encoder writes of that event (its
// attributes in the order it writes them, its data as encoded, its
// extensions in name order), without building the event first. That
// holds where every attribute is a string no encoder escapes, as
// toolgate's ids, sources, types, tenants and trace headers are; any
// other event is built and encoded by the SDK.
func InvocationEvent(subject string, inv *envelope.Invocation, source, typ string, data any, at time.Time) (Output, int, error) {
	suffix := envelope.SubjectSuffix(typ)
	id := inv.ID + ":" + suffix
	tc := inv.Origin // as NewEvent picks it
	if tc.TraceParent == "" {
		tc = envelope.TraceContext{TraceParent: inv.TraceParent, TraceState: inv.TraceState}
	}
	if _, raw := data.([]byte); data == nil || raw || !word(inv.ID) || !word(suffix) || !urn(source) || !word(typ) ||
		!plain(inv.Tenant) || !plain(tc.TraceParent) || !plain(tc.TraceState) {
		return sdkEvent(subject, inv, source, typ, data, at)
	}
	b, err := envelope.Marshal(data)
	if err != nil {
		return Output{}, 0, err
	}
	out := make([]byte, 0, len(b)+len(id)+len(source)+len(typ)+len(inv.ID)+len(inv.Tenant)+len(tc.TraceParent)+len(tc.TraceState)+192)
	out = append(append(out, `{"specversion":"1.0","id":"`...), id...)
	out = append(append(out, `","source":"`...), source...)
	out = append(append(out, `","type":"`...), typ...)
	out = append(append(out, `","subject":"`...), inv.ID...)
	out = append(out, `","datacontenttype":"application/json"`...)
	if !at.IsZero() {
		out = at.UTC().AppendFormat(append(out, `,"time":"`...), time.RFC3339Nano)
		out = append(out, '"')
	}
	out = append(append(out, `,"data":`...), b...)
	end := len(out) - 1
	out = append(append(out, `,"tenantid":"`...), inv.Tenant...)
	if tc.TraceParent != "" {
		out = append(append(out, `","traceparent":"`...), tc.TraceParent...)
		if tc.TraceState != "" {
			out = append(append(out, `","tracestate":"`...), tc.TraceState...)
		}
	}
	out = append(out, `"}`...)
	return EncodedEventOutput(subject, "", out), end, nil
}

// sdkEvent is InvocationEvent by the SDK.
func sdkEvent(subject string, inv *envelope.Invocation, source, typ string, data any, at time.Time) (Output, int, error) {
	e, err := inv.NewEvent(source, typ, data)
	if err != nil {
		return Output{}, 0, err
	}
	e.SetTime(at)
	b, err := e.MarshalJSON()
	if err != nil {
		return Output{}, 0, err
	}
	return EncodedEventOutput(subject, "", b), bytes.LastIndex(b, e.Data()) + len(e.Data()) - 1, nil
}

// plain reports a string every JSON encoder writes as it is, between
// quotes: printable ASCII but for the quote, the backslash and what an
// encoder may escape for HTML.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// word is a plain string without spaces, which the SDK would trim or
// refuse in an id or subject.
func word(s string) bool { return s != "" && plain(s) && !strings.Contains(s, " ") }

// urn is a source the SDK writes back as it was given: urn:toolgate:stage.
func urn(s string) bool {
	stage, ok := strings.CutPrefix(s, "urn:toolgate:")
	return ok && word(stage) && !strings.ContainsAny(stage, "%?#/")
}
