package signedstate

import (
	"encoding/json"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// FuzzRecords: a stored record is anyone's bytes who may write the
// bucket. Whatever they are, the checks answer without panicking, and
// nothing without a signed request passes.
func FuzzRecords(f *testing.F) {
	f.Add([]byte(`{"manifest":{"id":"t","version":"1.0.0"},"registered_by":"operator:a"}`), []byte(`{"manifest":{"id":"t"}}`))
	f.Add([]byte(`{"model":{"name":"m"},"by":"operator:a"}`), []byte(`{"model":{"name":"m"}}`))
	f.Add([]byte(`{"rego":"package x","by":"operator:a"}`), []byte(`{"rego":"package x"}`))
	f.Add([]byte(`{"key":"k","state":"open","forced":true,"by":"operator:a"}`), []byte(`{"key":"k","state":"open"}`))
	accept := func(*api.DecisionProof) (string, error) { return "operator:a", nil }
	f.Fuzz(func(t *testing.T, record, body []byte) {
		var tr kvstore.ToolRecord
		var mr kvstore.ModelRecord
		var br kvstore.BreakerState
		_ = json.Unmarshal(record, &tr)
		_ = json.Unmarshal(record, &mr)
		_ = json.Unmarshal(record, &br)
		if Tool(tr, accept) == nil && tr.Proof == nil {
			t.Fatal("an unsigned tool record passed")
		}
		if Model(mr, modelrouter.RoutingKey, accept) == nil && mr.Proof == nil {
			t.Fatal("an unsigned routing policy passed")
		}
		if _, err := Breaker(br, accept); err == nil && br.Proof == nil {
			t.Fatal("an unsigned breaker state passed")
		}
		// Signed with whatever body: still no panic.
		tr.Proof = &api.DecisionProof{Subject: subjects.SvcToolsRegister, Body: body}
		_ = Tool(tr, accept)
		mr.Proof = &api.DecisionProof{Subject: subjects.SvcModelsPolicy, Body: body}
		_ = Model(mr, modelrouter.RoutingKey, accept)
		mr.Proof.Subject = subjects.SvcModelsRegister
		_ = Model(mr, "m", accept)
		br.Proof = &api.DecisionProof{Subject: subjects.SvcBreakersSet, Body: body}
		_, _ = Breaker(br, accept)
	})
}
