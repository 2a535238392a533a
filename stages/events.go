package stages

import (
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
	return Output{Subject: subject, MsgID: msgID,
		Header: map[string][]string{"Content-Type": {event.ApplicationCloudEventsJSON}}, Data: data}
}

// AuditEvent is the audit CloudEvent of type typ about inv, published by
// stage. Its message id is unique per accepted publish and type.
func AuditEvent(stage string, inv *envelope.Invocation, typ string, data any) (Output, error) {
	e, err := inv.NewEvent("urn:toolgate:"+stage, typ, data)
	if err != nil {
		return Output{}, err
	}
	suffix := envelope.SubjectSuffix(typ)
	o, err := EventOutput(subjects.AuditEvent(inv.Tenant, suffix), e)
	o.MsgID = inv.MsgID("audit." + suffix)
	return o, err
}
