package envelope

import (
	"encoding/json"
	"errors"
	"mime"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// The ingest decoder as it was before its fast paths: the reference the
// generated events of TestFromMessageVerdictsUnchanged are held to.

func fromMessageOld(subject string, header map[string][]string, body []byte, seq uint64, now time.Time) (*Invocation, error) {
	inv := &Invocation{
		ID:         "seq-" + strconv.FormatUint(seq, 10),
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

	e, mode, err := decodeEventOld(header, body)
	id := eventIDOld(e, header, body)
	if e != nil {
		inv.Event = Event{ID: e.ID(), Source: e.Source(), Type: e.Type(), SpecVersion: e.SpecVersion(),
			Time: e.Time(), Mode: mode, Size: inv.Event.Size, Seq: seq}
	}
	idErr := subjects.CheckID(id)
	if idErr == nil {
		inv.ID = id
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
	if tp, ok := e.Extensions()["traceparent"].(string); ok && refTraceParent.MatchString(tp) {
		inv.TraceParent = tp
	}
	if ts, ok := e.Extensions()["tracestate"].(string); ok && len(ts) <= 512 && printable(ts) {
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

func eventIDOld(e *event.Event, header map[string][]string, body []byte) string {
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

func structuredOld(header map[string][]string, body []byte) (string, bool) {
	ct := headerValue(header, headerContentType)
	if mt, _, _ := mime.ParseMediaType(ct); format.IsFormat(mt) {
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

func decodeEventOld(header map[string][]string, body []byte) (*event.Event, string, error) {
	if mt, ok := structuredOld(header, body); ok {
		if mt != event.ApplicationCloudEventsJSON {
			return nil, "structured", api.NewError(api.InvalidParameters, api.EMalformedEvent,
				"unsupported structured format %q: use %s", mt, event.ApplicationCloudEventsJSON)
		}
		e := event.New()
		if err := format.JSON.Unmarshal(body, &e); err != nil {
			return nil, "structured", api.WrapError(err, api.InvalidParameters, api.EMalformedEvent,
				"structured CloudEvent is not valid JSON: %v", err)
		}
		return &e, "structured", validateEventOld(&e)
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
			v, err := decodeHeader(values[0])
			if err != nil {
				return &e, "binary", api.WrapError(err, api.InvalidParameters, api.EInvalidAttribute,
					"header %s: %v", lname, err)
			}
			if attr := version.Attribute(lname); attr != nil {
				if err := attr.Set(e.Context, v); err != nil {
					return &e, "binary", api.WrapError(err, api.InvalidParameters, api.EInvalidAttribute,
						"attribute %s: %v", attr.Name(), err)
				}
				continue
			}
			e.SetExtension(strings.TrimPrefix(lname, headerPrefix), v)
		}
	}
	e.DataEncoded = body
	return &e, "binary", validateEventOld(&e)
}

// TestFromMessageVerdictsUnchanged holds FromMessage to the decoder before
// its fast paths over generated binary and structured events, valid and
// not: the same invocation, the same error, code and message.
func TestFromMessageVerdictsUnchanged(t *testing.T) {
	cts := []string{"", "application/json", "application/json; charset=utf-8", "Application/JSON",
		"application/json;charset=utf-8", "application/json; charset=UTF-8", " application/json",
		"application/json ", "application/cloudevents+json", "application/cloudevents+json; charset=utf-8",
		"APPLICATION/CLOUDEVENTS+JSON", "application/cloudevents+json; charset=utf-8; x=y",
		"application/cloudevents-batch+json", "application/cloudevents+avro", "application/vnd.x+json",
		"text/plain", "application/json; charset", "application/json;;", "application/", "/json", "%%%", "\x00"}
	specs := []string{"", "1.0", "0.3", "2.0", "1", " 1.0", "1.0 "}
	sources := []string{"", "urn:agent:a", "/agents/a", " ", "%zz", "http://x/ a", "::"}
	ids := []string{"", "inv-1", " ", "a%20b", "a b", "..", "\xff"}
	types := []string{"", EventType, " "}
	bodies := []string{reqJSON, "", "not json", `{"a":`, `[1]`, `"s"`}
	names := func(n string, upper bool) string {
		if upper {
			return strings.ToUpper(n[:1]) + n[1:]
		}
		return n
	}
	n := 0
	// An event refused while its headers are read is refused at whichever
	// bad header the map's order comes to first, with what was read so far:
	// for those only the verdict, its code and the id are compared.
	check := func(h map[string][]string, body []byte) {
		t.Helper()
		n++
		sameVerdict(t, h, body)
	}
	i := 0
	pick := func(xs []string) string { i++; return xs[(i*7919)%len(xs)] }
	// Binary mode.
	for _, ct := range cts {
		for _, sv := range specs {
			for _, src := range sources {
				for k := 0; k < 4; k++ {
					h := map[string][]string{}
					set := func(name, v string) {
						if v != "" || k == 3 {
							h[names(name, k%2 == 1)] = []string{v}
						}
					}
					set("ce-specversion", sv)
					set("ce-id", pick(ids))
					set("ce-source", src)
					set("ce-type", pick(types))
					set("content-type", ct)
					if k >= 2 {
						set("ce-traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
						set("ce-tracestate", pick([]string{"a=b", "\x01", ""}))
						set("ce-subject", pick([]string{"s", " ", ""}))
						set("ce-dataschema", pick([]string{"http://s/x", "rel", ":"}))
						set("ce-time", pick([]string{"2024-01-01T00:00:00Z", "yesterday"}))
						set("ce-bad_ext", pick([]string{"x", ""}))
						if ct == "" && k == 2 { // both name the data's type: the map's order picks one
							set("ce-datacontenttype", pick(cts))
						}
					}
					check(h, []byte(pick(bodies)))
				}
			}
		}
	}
	// One attribute of a valid binary event changed, missing or blank.
	for _, name := range []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "content-type",
		"ce-subject", "ce-dataschema", "ce-time", "ce-datacontenttype", "ce-traceparent", "ce-tracestate", "ce-x"} {
		vals := append(append([]string{"", " ", "\t", "x", "%20", "http://s/x"}, cts...), specs...)
		for _, v := range vals {
			for _, drop := range []bool{false, true} {
				h := map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {"inv-1"}, "ce-source": {"urn:agent:a"},
					"ce-type": {EventType}, "content-type": {"application/json"}}
				if name == "ce-datacontenttype" {
					delete(h, "content-type")
				}
				if drop {
					delete(h, name)
				} else {
					h[name] = []string{v}
				}
				check(h, []byte(reqJSON))
			}
		}
	}
	// Structured mode.
	for _, ct := range cts {
		for _, sv := range specs {
			for _, src := range sources {
				for k := 0; k < 3; k++ {
					doc := map[string]any{"data": json.RawMessage(reqJSON)}
					put := func(name, v string) {
						if v != "" || k == 2 {
							doc[name] = v
						}
					}
					put("specversion", sv)
					put("id", pick(ids))
					put("source", src)
					put("type", pick(types))
					put("datacontenttype", pick(cts))
					if k >= 1 {
						put("traceparent", pick([]string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x"}))
						put("tracestate", pick([]string{"a=b", "\x01", ""}))
						put("subject", pick([]string{"s", " ", ""}))
						put("dataschema", pick([]string{"http://s/x", "rel", ":"}))
						put("time", pick([]string{"2024-01-01T00:00:00Z", "yesterday"}))
					}
					body, err := json.Marshal(doc)
					if err != nil {
						t.Fatal(err)
					}
					h := map[string][]string{}
					if ct != "" {
						h[names("content-type", k == 1)] = []string{ct}
					}
					check(h, body)
					if k == 0 {
						check(h, []byte(pick(bodies)))
					}
				}
			}
		}
	}
	t.Logf("%d events compared", n)
}

func validateEventOld(e *event.Event) error {
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

// sameVerdict fails t when FromMessage and the decoder before its fast
// paths read a message differently.
func sameVerdict(t testing.TB, h map[string][]string, body []byte) {
	t.Helper()
	now := time.Unix(1700000000, 0)
	got, gerr := FromMessage("tool.invoke.acme", h, body, 3, now)
	want, werr := fromMessageOld("tool.invoke.acme", h, body, 3, now)
	var ge, we *api.Error
	if (gerr == nil) != (werr == nil) || errors.As(gerr, &ge) != errors.As(werr, &we) || ge != nil && ge.ECode != we.ECode {
		t.Fatalf("header %v body %q: error %#v, want %#v", h, body, gerr, werr)
	}
	var de *api.Error
	if _, _, derr := decodeEventOld(h, body); errors.As(derr, &de) &&
		(strings.HasPrefix(de.Message, "header ") || strings.HasPrefix(de.Message, "attribute ")) {
		if got.ID != want.ID {
			t.Fatalf("header %v body %q: id %q, want %q", h, body, got.ID, want.ID)
		}
		return
	}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Fatalf("header %v body %q:\n got  %s\n want %s", h, body, gj, wj)
	}
	if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
		t.Fatalf("header %v body %q: error %v, want %v", h, body, gerr, werr)
	}
	if ge != nil && len(ge.Fields) != len(we.Fields) {
		t.Fatalf("header %v body %q: error %#v, want %#v", h, body, gerr, werr)
	}
}

// FuzzFromMessageVerdicts holds FromMessage to the decoder before its fast
// paths on arbitrary headers and bodies. Headers whose reading depends on
// the map's order (one attribute named twice) are left out.
func FuzzFromMessageVerdicts(f *testing.F) {
	f.Add("ce-specversion", "1.0", "ce-source", "urn:a", "content-type", "application/json", []byte(reqJSON))
	f.Add("content-type", "application/cloudevents+json; charset=utf-8", "x", "y", "ce-id", "i", []byte(`{"specversion":"1.0","id":"1","source":"s","type":"t","data":{}}`))
	f.Add("ce-specversion", "1.0", "ce-id", "i", "ce-type", "t", []byte(`{}`))
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string, body []byte) {
		h := map[string][]string{"ce-specversion": {"1.0"}, "ce-id": {"inv-1"}, "ce-source": {"urn:agent:a"}, "ce-type": {EventType}}
		if k1 != "" {
			h = map[string][]string{}
		}
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			h[kv[0]] = []string{kv[1]}
		}
		seen := map[string]bool{}
		for k := range h {
			lk := strings.ToLower(k)
			if lk == headerContentType {
				lk = headerPrefix + "datacontenttype"
			}
			if seen[lk] {
				t.Skip("one attribute named twice")
			}
			seen[lk] = true
		}
		sameVerdict(t, h, body)
	})
}

// refTraceParent is the W3C traceparent form as the reference decoder
// read it.
var refTraceParent = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// FuzzTraceParent holds isTraceParent to the pattern's verdict.
func FuzzTraceParent(f *testing.F) {
	good := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, s := range []string{good, "", "x", good + "\n", good[:54], strings.ToUpper(good),
		strings.Replace(good, "-", "_", 1), strings.Replace(good, "4", "g", 1), "0" + good[1:2] + good[2:],
		good[:2] + "-" + good[3:], "ff-ffffffffffffffffffffffffffffffff-ffffffffffffffff-ff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := isTraceParent(s), refTraceParent.MatchString(s); got != want {
			t.Fatalf("isTraceParent(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}

// TestTraceParentForm: every one-byte change of a valid traceparent is
// judged as the pattern judges it.
func TestTraceParentForm(t *testing.T) {
	good := []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	for i := range good {
		for _, c := range []byte{'0', '9', 'a', 'f', 'g', 'A', 'F', '-', '_', ' ', '\n', 0, 0xc3} {
			s := []byte(string(good))
			s[i] = c
			if got, want := isTraceParent(string(s)), refTraceParent.MatchString(string(s)); got != want {
				t.Fatalf("isTraceParent(%q) = %v, the pattern says %v", s, got, want)
			}
		}
	}
	if !isTraceParent(string(good)) || isTraceParent(string(good)+"0") || isTraceParent(string(good[1:])) {
		t.Fatal("the length is not judged")
	}
}
