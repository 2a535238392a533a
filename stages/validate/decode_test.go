package validate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
)

// FuzzDecodeRequest: a request the schema check passed decodes to what
// encoding/json makes of it, or fails as it fails.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi"}}`)
	f.Add(`{"tool_id":"e\u00e9\"<&>","TOOL_ID":"x","agent_context":{"tenant_id":"a","session_id":"s"},"parameters": [1, 2.5e3, {"a" : null}] ,` +
		`"resource_limits":{"timeout_seconds":30,"cpu_millicore_limit":100},"execution_options":{"async_mode":true,"priority":"high","idempotency_key":"k"},` +
		`"checkpoint_config":{"enable_checkpointing":false,"checkpoint_interval_seconds":5},"capability_token":"eyJ.x.y"}`)
	f.Add(`{"tool_id":1}`)
	f.Add(`{"resource_limits":{"timeout_seconds":1.5}}`)
	f.Add(`{"parameters":"\ud800","tool_id":null,"agent_context":null}`)
	f.Add(`{"tool_id":"a","tool_id":"b","redrive":{"depth":-1},"link":{"parent":"p"}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		if !json.Valid([]byte(doc)) {
			t.Skip()
		}
		var want, got api.Request
		werr := json.Unmarshal([]byte(doc), &want)
		gerr := decodeRequest([]byte(doc), &got)
		if (werr == nil) != (gerr == nil) || (werr == nil && !reflect.DeepEqual(got, want)) {
			t.Fatalf("decoded (%v)\n%#v\nencoding/json (%v)\n%#v", gerr, got, werr, want)
		}
	})
}

// TestRequestDigestAsStored: the digest an id claim records is the hex
// SHA-256 of the source, a zero byte and the data, as records already
// stored hold it.
func TestRequestDigestAsStored(t *testing.T) {
	inv := &envelope.Invocation{Data: []byte(`{"tool_id":"echo"}`)}
	inv.Event.Source = "urn:agent:a"
	sum := sha256.Sum256([]byte("urn:agent:a\x00{\"tool_id\":\"echo\"}"))
	if got, want := requestDigest(inv), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("digest %s, want %s", got, want)
	}
}

// TestDataNotJSONRefused: the schema check takes the event data for JSON
// (Decode refused any other): data that is not, arriving still, is refused
// at decoding, whatever the walk over it found.
func TestDataNotJSONRefused(t *testing.T) {
	v := New(tools.NewRegistry(), Config{})
	for _, doc := range []string{
		`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":"hi",}}`,
		`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"message":tru}}`,
		`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":[1 2]}`,
		`{"tool_id":"echo","agent_context":{"agent_did":"did:agent:a","tenant_id":"acme"},"parameters":{"a":01}}`,
	} {
		inv := &envelope.Invocation{ID: "i-1", Tenant: "acme", Data: []byte(doc)}
		inv.Event.Type = envelope.EventType
		_, err := v.Process(context.Background(), inv)
		var ae *api.Error
		if !errors.As(err, &ae) || ae.ECode != api.ERequestInvalid {
			t.Errorf("%s: %v, want %s", doc, err, api.ERequestInvalid)
		}
	}
}
