package kvstore_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/kvstore"
)

// BenchmarkStatusLife is what one call costs the status bucket, the server
// included: validate's claim, execute's read, audit's terminal status with
// its response.
func BenchmarkStatusLife(b *testing.B) {
	_, js := natstest.JetStream(b)
	s, err := kvstore.Open(context.Background(), js, kvstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	result := json.RawMessage(`{"echo":"` + strings.Repeat("x", 200) + `"}`)
	b.ReportAllocs()
	n := uint64(0)
	for b.Loop() {
		n++
		id := "inv-" + strconv.FormatUint(n, 10)
		if _, _, err := s.ClaimInvocation(ctx, "acme", id, n, "d", "did:agent:a", "echo", ""); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Status(ctx, "acme", id); err != nil {
			b.Fatal(err)
		}
		md := &api.ExecutionMetadata{ToolID: "echo", ToolVersion: "1.0.0", DurationMS: 3, StartedAt: "2026-01-01T00:00:00Z"}
		rec := api.Record{InvocationID: id, Tenant: "acme", Status: api.StatusSuccess, ToolID: "echo", ToolVersion: "1.0.0", Seq: n,
			Response: &api.Response{InvocationID: id, Status: api.StatusSuccess, Result: result, ExecutionMetadata: md,
				Receipt: &api.Receipt{V: 2, InvocationID: id, Tenant: "acme", Status: api.StatusSuccess, EventID: id + ":tool.succeeded",
					IssuedAt: "2026-01-01T00:00:00Z", Key: "N", Sig: strings.Repeat("s", 88), ResultSHA256: strings.Repeat("a", 64)}},
			Ending: "PIPELINE:" + strconv.FormatUint(n, 10)}
		if _, ok, err := s.SetStatus(ctx, rec); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
