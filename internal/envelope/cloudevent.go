package envelope

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// EventType is the CloudEvent type of an invocation request.
const EventType = api.TypeInvoke

// Binary-mode header names, per the CloudEvents NATS binding.
const (
	headerPrefix      = "ce-"
	headerContentType = "content-type"
)

var binarySpec = spec.WithPrefix(headerPrefix)

// MsgID is the Nats-Msg-Id a publisher sets for an event (api.MsgID).
func MsgID(source, id string) string { return api.MsgID(source, id) }

// InvokeMsgID is the Nats-Msg-Id of a tool.invoke event (api.InvokeMsgID).
func InvokeMsgID(tenant, source, id string) string { return api.InvokeMsgID(tenant, source, id) }

// FromMessage decodes a message that arrived on tool.invoke.<tenant> into a
// new Invocation, in binary mode (ce-* headers, data as the body) or structured
// mode (content-type application/cloudevents+json, or no content type and a
// JSON object with specversion as the body). It always returns an
// Invocation, so that even garbage ends with a terminal status: when the event
// cannot be read, the id is the event's own id if one can be found (ce-id, or
// "id" in a JSON body), else "seq-<stream sequence>", and the error says why,
// with a stable code.
//
// The returned Invocation can always be encoded as JSON and its tenant and id
// always make valid subjects and keys: both are checked here, before anything
// builds a subject from them. A subject tenant that is not acceptable is
// replaced by subjects.SystemTenant, which audit never publishes a result for.
func FromMessage(subject string, header map[string][]string, body []byte, seq uint64, now time.Time) (*Invocation, error) {
	inv := &Invocation{
		ReceivedAt: now,
		Status:     api.StatusPending,
	}
	inv.Event.Size = len(body) + headerSize(header)
	inv.Event.Seq = seq
	tenant, _ := subjects.TenantOfInvoke(subject)
	inv.Tenant = tenant
	tenantErr := subjects.CheckTenant(tenant)
	if tenantErr != nil {
		inv.Tenant = subjects.SystemTenant
	}

	e, mode, err := decodeEvent(header, body)
	id := eventID(e, header, body)
	if e != nil {
		inv.Event = Event{ID: e.ID(), Source: e.Source(), Type: e.Type(), SpecVersion: e.SpecVersion(),
			Time: e.Time(), Mode: mode, Size: inv.Event.Size, Seq: seq}
	}
	idErr := subjects.CheckID(id)
	if idErr == nil {
		inv.ID = id
	} else {
		inv.ID = "seq-" + strconv.FormatUint(seq, 10)
	}
	switch {
	case tenantErr != nil:
		return inv, api.WrapError(tenantErr, api.InvalidParameters, api.EInvalidName,
			"the subject's tenant is not acceptable (%s): %v", subjects.TenantPattern, tenantErr).
			WithDetail("tenant", clip(tenant))
	case idErr != nil && id != "":
		return inv, api.WrapError(idErr, api.InvalidParameters, api.EInvalidName,
			"the event id is not acceptable: %v", idErr).WithDetail("id", clip(id))
	case err != nil:
		return inv, err
	}
	ext := extensions(e)
	if tp, ok := ext["traceparent"].(string); ok && isTraceParent(tp) {
		inv.TraceParent = tp
	}
	if ts, ok := ext["tracestate"].(string); ok && len(ts) <= 512 && printable(ts) {
		inv.TraceState = ts
	}
	// OpenTelemetry propagators write plain W3C headers, not ce- ones.
	if inv.TraceParent == "" {
		inv.TraceParent = headerValue(header, "traceparent")
		inv.TraceState = headerValue(header, "tracestate")
	}
	if ct := e.DataContentType(); ct != "" {
		mt, perr := mediaType(ct)
		if perr != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return inv, api.NewError(api.InvalidParameters, api.EInvalidAttribute,
				"datacontenttype %q: the data of tool.invoke must be JSON", ct)
		}
	}
	// Data travels as a json.RawMessage in every hand-off: data that is not
	// JSON (or nests past the decoder's limit) would make the invocation
	// impossible to encode, so it is refused here, where it is still readable.
	if d := e.Data(); len(d) > 0 {
		if !json.Valid(d) {
			return inv, api.NewError(api.InvalidParameters, api.EInvalidAttribute,
				"the event data is not valid JSON")
		}
		inv.Data = d
	}
	return inv, nil
}

// extensions are an event's extension attributes, read in place: the
// SDK's Extensions copies them, and nothing here keeps or changes them.
func extensions(e *event.Event) map[string]any {
	if ec, ok := e.Context.(*event.EventContextV1); ok {
		return ec.Extensions
	}
	return e.Extensions()
}

// newContext is a fresh, empty context of version: for 1.0, what
// NewContext's clone of the empty template comes to, without the clone.
func newContext(version spec.Version) event.EventContext {
	if version.String() == event.CloudEventsVersionV1 {
		return &event.EventContextV1{}
	}
	return version.NewContext()
}

// mediaType is mime.ParseMediaType's media type of ct; the exact forms
// producers send (JSON and CloudEvents JSON, with or without a UTF-8
// charset) are told at once, everything else goes through the parser.
func mediaType(ct string) (string, error) {
	if mt, ok := plainType(ct); ok {
		return mt, nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	return mt, err
}

// plainType is the media type of ct when ct is one of those exact forms.
func plainType(ct string) (string, bool) {
	switch ct {
	case "application/json", "application/json; charset=utf-8":
		return "application/json", true
	case event.ApplicationCloudEventsJSON, event.ApplicationCloudEventsJSON + "; charset=utf-8":
		return event.ApplicationCloudEventsJSON, true
	}
	return "", false
}

// isTraceParent reports whether s has the W3C traceparent form
// (^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$); anything else is
// dropped rather than carried into later hops' headers. Read byte by byte:
// the pattern's matcher cost a sixth of the ingest's decode.
func isTraceParent(s string) bool {
	if len(s) != 55 {
		return false
	}
	for i := range len(s) {
		c := s[i]
		switch i {
		case 2, 35, 52:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
	}
	return true
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// clip shortens a refused name for error details.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\ufffd")
}

// eventID finds the id of an event, even one that cannot be decoded, so that
// its error reaches the subject its sender listens on.
func eventID(e *event.Event, header map[string][]string, body []byte) string {
	if e != nil && e.ID() != "" {
		return e.ID()
	}
	if v := headerValue(header, headerPrefix+"id"); v != "" {
		if d, err := decodeHeader(v); err == nil {
			return d
		}
		return v
	}
	var doc struct {
		ID any `json:"id"`
	}
	if json.Unmarshal(body, &doc) == nil {
		if s, ok := doc.ID.(string); ok {
			return s
		}
	}
	return ""
}

// structured reports whether a message is a structured-mode event: its
// content type is a CloudEvents format, or it has no content type and no
// ce-specversion header and its body is a JSON object with specversion (what
// the CloudEvents Go SDK's NATS JetStream sender produces).
func structured(header map[string][]string, body []byte) (string, bool) {
	ct := headerValue(header, headerContentType)
	if mt, _ := mediaType(ct); format.IsFormat(mt) {
		return mt, true
	}
	if ct != "" || headerValue(header, headerPrefix+"specversion") != "" {
		return "", false
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(body, &doc) != nil {
		return "", false
	}
	if _, ok := doc["specversion"]; ok {
		return event.ApplicationCloudEventsJSON, true
	}
	return "", false
}

func decodeEvent(header map[string][]string, body []byte) (*event.Event, string, error) {
	if mt, ok := structured(header, body); ok {
		if mt != event.ApplicationCloudEventsJSON {
			return nil, "structured", api.NewError(api.InvalidParameters, api.EMalformedEvent,
				"unsupported structured format %q: use %s", mt, event.ApplicationCloudEventsJSON)
		}
		e := event.New()
		if err := format.JSON.Unmarshal(body, &e); err != nil {
			return nil, "structured", api.WrapError(err, api.InvalidParameters, api.EMalformedEvent,
				"structured CloudEvent is not valid JSON: %v", err)
		}
		return &e, "structured", validateEvent(&e)
	}
	sv := headerValue(header, headerPrefix+"specversion")
	if sv == "" {
		return nil, "", api.NewError(api.InvalidParameters, api.EMalformedEvent,
			"not a CloudEvent: no ce-specversion header and content-type is not %s", event.ApplicationCloudEventsJSON)
	}
	version := binarySpec.Version(sv)
	if version == nil {
		return nil, "binary", api.NewError(api.InvalidParameters, api.EInvalidAttribute,
			"unsupported specversion %q", sv)
	}
	e := event.Event{Context: newContext(version)}
	for name, values := range header {
		if len(values) == 0 {
			continue
		}
		lname := lowerName(name)
		switch {
		case lname == headerContentType:
			e.SetDataContentType(values[0])
		case lname == headerPrefix+"specversion":
		case strings.HasPrefix(lname, headerPrefix):
			v, err := decodeHeader(values[0])
			if err != nil {
				return &e, "binary", api.WrapError(err, api.InvalidParameters, api.EInvalidAttribute,
					"header %s: %v", lname, err)
			}
			if attr := version.Attribute(lname); attr != nil {
				if err := setAttribute(e.Context, attr, v); err != nil {
					return &e, "binary", api.WrapError(err, api.InvalidParameters, api.EInvalidAttribute,
						"attribute %s: %v", attr.Name(), err)
				}
				continue
			}
			e.SetExtension(strings.TrimPrefix(lname, headerPrefix), v)
		}
	}
	e.DataEncoded = body
	return &e, "binary", validateEvent(&e)
}

// setAttribute is attr.Set(ec, v): for the string attributes every 1.0
// event has, straight to the setter the SDK's Set comes to, without
// boxing v.
func setAttribute(ec event.EventContext, attr spec.Attribute, v string) error {
	if c, ok := ec.(*event.EventContextV1); ok {
		switch attr.Kind() {
		case spec.ID:
			return c.SetID(v)
		case spec.Source:
			return c.SetSource(v)
		case spec.Type:
			return c.SetType(v)
		}
	}
	return attr.Set(ec, v)
}

// binaryNames are the header names of a binary event's attributes, in
// lower case: lowerName returns them without a new string.
var binaryNames = []string{headerContentType, headerPrefix + "specversion", headerPrefix + "id",
	headerPrefix + "source", headerPrefix + "type", headerPrefix + "subject", headerPrefix + "time",
	headerPrefix + "dataschema", headerPrefix + "datacontenttype", headerPrefix + "traceparent",
	headerPrefix + "tracestate"}

// lowerName is strings.ToLower(name); the names headers carry (which
// nats.Header spells Ce-Id) need no allocation. A name of a known one's
// length that folds to it is ASCII: a non-ASCII rune that folds to an
// ASCII one is longer than it.
func lowerName(name string) string {
	for _, n := range binaryNames {
		if len(n) == len(name) && strings.EqualFold(n, name) {
			return n
		}
	}
	return strings.ToLower(name)
}

// decodeHeader reverses the percent-encoding of a ce-* header value that the
// CloudEvents NATS binding takes from the HTTP binding (§3.1.3.2): clients
// such as the Python SDK send a space as %20 and non-ASCII as UTF-8 %XX
// sequences. A value with a % that starts no valid escape is taken as it is,
// since many senders do not encode at all; a decoded value must be UTF-8.
func decodeHeader(v string) (string, error) {
	if !strings.Contains(v, "%") {
		return v, nil
	}
	d, err := url.PathUnescape(v)
	if err != nil {
		return v, nil
	}
	if !utf8.ValidString(d) {
		return "", fmt.Errorf("percent-decoded value is not UTF-8")
	}
	return d, nil
}

// plainlyValid reports whether the SDK's Validate is sure to pass e
// without running it (it builds maps, prints the source and parses the
// content type): a 1.0 event whose attributes are all plainly there.
// Anything less plain goes through Validate, which gives the verdict.
func plainlyValid(e *event.Event) bool {
	ec, ok := e.Context.(*event.EventContextV1)
	if !ok || len(e.FieldErrors) > 0 || ec.DataSchema != nil {
		return false
	}
	if strings.TrimSpace(ec.ID) == "" || strings.TrimSpace(ec.Type) == "" {
		return false
	}
	// A source with a scheme prints as "scheme:…": never blank.
	if ec.Source.Scheme == "" {
		return false
	}
	if ec.Subject != nil && strings.TrimSpace(*ec.Subject) == "" {
		return false
	}
	if ct := ec.DataContentType; ct != nil {
		if _, ok := plainType(*ct); !ok {
			return false
		}
	}
	return true
}

func validateEvent(e *event.Event) error {
	if plainlyValid(e) {
		return nil
	}
	err := e.Validate()
	if err == nil {
		return nil
	}
	var fields []api.FieldError
	if ve, ok := err.(event.ValidationError); ok {
		for k, v := range ve {
			fields = append(fields, api.FieldError{Location: k, Message: v.Error()})
		}
		sort.Slice(fields, func(i, j int) bool { return fields[i].Location < fields[j].Location })
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Location
	}
	return api.NewError(api.InvalidParameters, api.EInvalidAttribute,
		"invalid CloudEvent attributes: %s", strings.Join(names, ", ")).WithFields(fields)
}

func headerValue(h map[string][]string, name string) string {
	if vs := h[name]; len(vs) > 0 && vs[0] != "" {
		return vs[0]
	}
	for k, vs := range h {
		if strings.EqualFold(k, name) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

func headerSize(h map[string][]string) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}
