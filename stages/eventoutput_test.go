package stages

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
)

// FuzzEventOutput: an event's bytes are compact JSON with the value
// json.Marshal makes of it, whatever its attributes and data hold (HTML,
// unicode, escapes): only json.Marshal's second scan is saved, which also
// escapes <, > and & in the attributes.
func FuzzEventOutput(f *testing.F) {
	f.Add("hello", `{"a":[1,2.5e10,"x"]}`)
	f.Add("<script>&amp;</script>", `{"html":"<b>&</b>","u":"\u2028\u00e9"}`)
	f.Add("line\nbreak\"quote\\", `"plain"`)
	f.Fuzz(func(t *testing.T, text, raw string) {
		var data any = map[string]any{"text": text}
		if json.Valid([]byte(raw)) {
			data = map[string]any{"text": text, "raw": json.RawMessage(raw)}
		}
		inv := &envelope.Invocation{ID: "inv-" + text, Tenant: "acme", Event: envelope.Event{Seq: 7, Source: "urn:" + text}}
		e, err := inv.NewEvent("urn:toolgate:audit", api.TypeSucceeded, data)
		if err != nil {
			t.Skip()
		}
		o, err := EventOutput("audit.acme.x", e)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, o.Data); err != nil || !bytes.Equal(compact.Bytes(), o.Data) {
			t.Fatalf("not compact JSON (%v): %s", err, o.Data)
		}
		var got, exp any
		if err := json.Unmarshal(o.Data, &got); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(want, &exp); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, exp) {
			t.Fatalf("event\n%s\nwant\n%s", o.Data, want)
		}
	})
}

// BenchmarkEventOutput is an audit event of a call with a 500-byte
// result as its data, as audit's ending writes one.
func BenchmarkEventOutput(b *testing.B) {
	inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 7, Source: "urn:agent"}}
	data := map[string]any{"result": json.RawMessage(`{"echo":"` + strings.Repeat("x", 500) + `"}`)}
	b.ReportAllocs()
	for b.Loop() {
		e, err := inv.NewEvent("urn:toolgate:audit", api.TypeSucceeded, data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := EventOutput("audit.acme.x", e); err != nil {
			b.Fatal(err)
		}
	}
}
