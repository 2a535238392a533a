package invocation

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"mime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/toolgate/toolgate/stages/toolerr"
	"github.com/toolgate/toolgate/subjects"
)

// EventType is the CloudEvent type of an invocation request.
const EventType = "tool.invoke"

// Binary-mode header names, per the CloudEvents NATS binding.
const (
	headerPrefix      = "ce-"
	headerContentType = "content-type"
)

var binarySpec = spec.WithPrefix(headerPrefix)

// MsgID is the Nats-Msg-Id a publisher sets for an event: CloudEvents treats
// equal source and id as the same event, so JetStream drops the repeat.
func MsgID(source, id string) string {
	sum := sha256.Sum256([]byte(source + "\x00" + id))
	return hex.EncodeToString(sum[:16])
}

// FromMessage decodes a message that arrived on tool.invoke.<tenant> into a
// new Invocation, in binary mode (ce-* headers, data as the body) or structured
// mode (content-type application/cloudevents+json). It always returns an
// Invocation, so that even garbage ends with a terminal status: when the event
// cannot be read, the id falls back to "seq-<stream sequence>" and the error
// says why, with a stable code.
func FromMessage(subject string, header nats.Header, body []byte, seq uint64, now time.Time) (*Invocation, error) {
	inv := &Invocation{
		ID:         "seq-" + strconv.FormatUint(seq, 10),
		Tenant:     tenantOf(subject),
		ReceivedAt: now,
		Status:     StatusPending,
	}
	inv.Event.Size = len(body) + headerSize(header)
	inv.Event.Seq = seq

	e, mode, err := decodeEvent(header, body)
	if e != nil {
		// Keep whatever identity the event has, even if it is incomplete.
		if id := strings.TrimSpace(e.ID()); id != "" {
			inv.ID = id
		}
		inv.Event = Event{ID: e.ID(), Source: e.Source(), Type: e.Type(), SpecVersion: e.SpecVersion(),
			Time: e.Time(), Mode: mode, Size: inv.Event.Size, Seq: seq}
	}
	if err != nil {
		return inv, err
	}
	if tp, ok := e.Extensions()["traceparent"].(string); ok {
		inv.TraceParent = tp
	}
	if ts, ok := e.Extensions()["tracestate"].(string); ok {
		inv.TraceState = ts
	}
	// OpenTelemetry propagators write plain W3C headers, not ce- ones.
	if inv.TraceParent == "" {
		inv.TraceParent = headerValue(header, "traceparent")
		inv.TraceState = headerValue(header, "tracestate")
	}
	if ct := e.DataContentType(); ct != "" {
		mt, _, perr := mime.ParseMediaType(ct)
		if perr != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return inv, toolerr.New(toolerr.InvalidParameters, toolerr.EInvalidAttribute,
				"datacontenttype %q: the data of tool.invoke must be JSON", ct)
		}
	}
	inv.Data = e.Data()
	return inv, nil
}

func decodeEvent(header nats.Header, body []byte) (*event.Event, string, error) {
	ct := headerValue(header, headerContentType)
	if mt, _, _ := mime.ParseMediaType(ct); format.IsFormat(mt) {
		if mt != event.ApplicationCloudEventsJSON {
			return nil, "structured", toolerr.New(toolerr.InvalidParameters, toolerr.EMalformedEvent,
				"unsupported structured format %q: use %s", mt, event.ApplicationCloudEventsJSON)
		}
		e := event.New()
		if err := format.JSON.Unmarshal(body, &e); err != nil {
			return nil, "structured", toolerr.Wrap(err, toolerr.InvalidParameters, toolerr.EMalformedEvent,
				"structured CloudEvent is not valid JSON: %v", err)
		}
		return &e, "structured", validateEvent(&e)
	}
	sv := headerValue(header, headerPrefix+"specversion")
	if sv == "" {
		return nil, "", toolerr.New(toolerr.InvalidParameters, toolerr.EMalformedEvent,
			"not a CloudEvent: no ce-specversion header and content-type is not %s", event.ApplicationCloudEventsJSON)
	}
	version := binarySpec.Version(sv)
	if version == nil {
		return nil, "binary", toolerr.New(toolerr.InvalidParameters, toolerr.EInvalidAttribute,
			"unsupported specversion %q", sv)
	}
	e := event.New()
	e.Context = version.NewContext()
	for name, values := range header {
		if len(values) == 0 {
			continue
		}
		lname := strings.ToLower(name)
		switch {
		case lname == headerContentType:
			e.SetDataContentType(values[0])
		case lname == headerPrefix+"specversion":
		case strings.HasPrefix(lname, headerPrefix):
			if attr := version.Attribute(lname); attr != nil {
				if err := attr.Set(e.Context, values[0]); err != nil {
					return &e, "binary", toolerr.Wrap(err, toolerr.InvalidParameters, toolerr.EInvalidAttribute,
						"attribute %s: %v", attr.Name(), err)
				}
				continue
			}
			e.SetExtension(strings.TrimPrefix(lname, headerPrefix), values[0])
		}
	}
	e.DataEncoded = body
	return &e, "binary", validateEvent(&e)
}

func validateEvent(e *event.Event) error {
	err := e.Validate()
	if err == nil {
		return nil
	}
	var fields []toolerr.FieldError
	if ve, ok := err.(event.ValidationError); ok {
		for k, v := range ve {
			fields = append(fields, toolerr.FieldError{Location: k, Message: v.Error()})
		}
		sort.Slice(fields, func(i, j int) bool { return fields[i].Location < fields[j].Location })
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Location
	}
	return toolerr.New(toolerr.InvalidParameters, toolerr.EInvalidAttribute,
		"invalid CloudEvent attributes: %s", strings.Join(names, ", ")).WithFields(fields)
}

// ToMessage encodes e in binary mode: attributes as ce-* headers, data as the
// body, plus the Nats-Msg-Id derived from source and id.
func ToMessage(e *event.Event) (nats.Header, []byte, error) {
	if err := e.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid event: %w", err)
	}
	h := nats.Header{}
	version := binarySpec.Version(e.SpecVersion())
	for _, attr := range version.Attributes() {
		if attr.Kind() == spec.DataContentType {
			continue
		}
		v := attr.Get(e.Context)
		if v == nil {
			continue
		}
		s, err := attrString(v)
		if err != nil {
			return nil, nil, err
		}
		if s != "" {
			h.Set(attr.PrefixedName(), s)
		}
	}
	for k, v := range e.Extensions() {
		s, err := attrString(v)
		if err != nil {
			return nil, nil, err
		}
		h.Set(headerPrefix+k, s)
	}
	if ct := e.DataContentType(); ct != "" {
		h.Set(headerContentType, ct)
	}
	h.Set(nats.MsgIdHdr, MsgID(e.Source(), e.ID()))
	return h, e.Data(), nil
}

func attrString(v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case time.Time:
		return t.UTC().Format(time.RFC3339Nano), nil
	case fmt.Stringer:
		return t.String(), nil
	}
	return fmt.Sprint(v), nil
}

func headerValue(h nats.Header, name string) string {
	if v := h.Get(name); v != "" {
		return v
	}
	for k, vs := range h {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

func headerSize(h nats.Header) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

func tenantOf(subject string) string {
	if t, ok := subjects.TenantOfInvoke(subject); ok {
		return t
	}
	return "unknown"
}
