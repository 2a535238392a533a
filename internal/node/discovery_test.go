package node_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestDiscoveryEndToEnd: search finds and ranks registered tools, usage
// statistics from real calls feed the ranking, and a capability request is
// matched, granted a child token that calls exactly the granted tool, and
// reported with what it used; every request and outcome is audited.
func TestDiscoveryEndToEnd(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{GrantSigner: testKey()})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const tenant = "disco"
	reg := func(id, fn, extra string) {
		doc := `{"id":"` + id + `","name":"` + id + `","version":"1.0.0","description":"a test tool","kind":"builtin",
		  "builtin":{"function":"` + fn + `"},"input_schema":{"type":"object"}` + extra + `}`
		if _, err := e.client.RegisterTool(ctx, []byte(doc), false); err != nil {
			t.Fatal(err)
		}
	}
	reg("disco.a", "maybe", `,"capabilities":["tally_rows"],"limits":{"timeout_ms":500}`)
	reg("disco.b", "maybe", `,"capabilities":["tally_rows"],"limits":{"timeout_ms":500}`)
	reg("disco.net", "maybe", `,"capabilities":["tally_rows"],"limits":{"timeout_ms":500},"safety":{"side_effects":["network.http"]}`)
	reg("disco.risky", "maybe", `,"capabilities":["tally_rows"],"limits":{"timeout_ms":500},"safety":{"risk_level":"high"}`)

	search := func(r api.ListRequest) []string {
		t.Helper()
		l, err := e.client.SearchTools(ctx, tenant, r)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range l.Tools {
			if strings.HasPrefix(s.ToolID, "disco.") {
				ids = append(ids, s.ToolID)
			}
		}
		return ids
	}
	if got := search(api.ListRequest{Query: "tally"}); !slices.Equal(got, []string{"disco.a", "disco.b", "disco.net", "disco.risky"}) {
		t.Fatalf("search before any call: %v", got)
	}
	if got := search(api.ListRequest{Query: "tally", RiskLevelMax: "medium", ExcludeSideEffects: []string{"network"}}); !slices.Equal(got, []string{"disco.a", "disco.b"}) {
		t.Fatalf("filtered search: %v", got)
	}
	// Calls of disco.b, recorded by the audit stage, lift it above disco.a.
	for range 3 {
		if r := e.invoke(request(tenant, "disco.b", `{}`)); r.Status != api.StatusSuccess {
			t.Fatalf("call: %+v", r)
		}
	}
	eventually(t, 10*time.Second, "statistics of disco.b", func() bool {
		st, err := e.client.ToolStats(ctx, "disco.b")
		return err == nil && len(st.Tools) == 1 && st.Tools[0].Calls == 3 && st.Tools[0].SuccessRate == 1
	})
	eventually(t, 5*time.Second, "usage to rank disco.b first", func() bool {
		got := search(api.ListRequest{Query: "tally", RiskLevelMax: "medium", ExcludeSideEffects: []string{"network"}})
		return slices.Equal(got, []string{"disco.b", "disco.a"})
	})
	// Pages: two of one, then the cursor of another search is refused.
	l, err := e.client.SearchTools(ctx, tenant, api.ListRequest{Query: "tally", PageSize: 1})
	if err != nil || len(l.Tools) != 1 || l.NextCursor == "" || l.TotalCount != 4 {
		t.Fatalf("first page %+v %v", l, err)
	}
	_, err = e.client.SearchTools(ctx, tenant, api.ListRequest{Query: "rows", Cursor: l.NextCursor})
	var te *api.Error
	if !errors.As(err, &te) || te.ECode != api.ESearchFailed {
		t.Fatalf("foreign cursor: %v, want E3005", err)
	}

	// A capability request with the agent's token is granted a child token
	// for the safe, local, read-only candidates.
	parent := tokenFor(tenant, "did:agent:test")
	doc := `{"kind":"capability_request","capability":"tally_rows","input_contract":"CSV text","output_contract":"a count",
	  "reason":"counting by reading is error-prone","request_id":"req-1","capability_token":"` + parent + `"}`
	resp, err := e.client.RequestCapabilityJSON(ctx, tenant, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Outcome != api.CapabilityGranted || resp.Grant == nil || len(resp.Candidates) != 3 || resp.Candidates[0].ToolID != "disco.b" {
		t.Fatalf("answer %+v", resp)
	}
	if resp.Considered["disco.net"] == "" || !slices.Equal(resp.Grant.Tools, []string{"disco.a", "disco.b"}) || resp.Grant.MaxCalls != 4 {
		t.Fatalf("grant %+v considered %v", resp.Grant, resp.Considered)
	}
	child := func(tool string) api.Response {
		req := request(tenant, tool, `{}`)
		req.CapabilityToken = resp.Grant.Token
		return e.invoke(req)
	}
	if r := child("disco.a"); r.Status != api.StatusSuccess {
		t.Fatalf("granted tool with the child token: %+v", r)
	}
	if r := child("disco.risky"); r.Status != api.StatusPermissionDenied || r.Error == nil || r.Error.ECode != api.ENotGranted {
		t.Fatalf("tool outside the grant with the child token: %+v", r)
	}
	eventually(t, 10*time.Second, "the report to show the call", func() bool {
		rep, err := e.client.CapabilityReport(ctx, tenant, "req-1")
		return err == nil && rep.Used != nil && rep.Used.Calls == 1 && rep.Request.Capability == "tally_rows" &&
			rep.Response.Grant.Token == "" && rep.Request.CapabilityToken == ""
	})
	// The same id again, a malformed request and an unmatched one.
	if _, err := e.client.RequestCapabilityJSON(ctx, tenant, []byte(doc)); !errors.As(err, &te) || te.ECode != api.ECapabilityDuplicate {
		t.Fatalf("second request-1: %v", err)
	}
	if _, err := e.client.RequestCapabilityJSON(ctx, tenant, []byte(`{"kind":"capability_request","capability":"x","extra":1}`)); !errors.As(err, &te) || te.ECode != api.ECapabilityInvalid {
		t.Fatalf("malformed: %v", err)
	}
	none, err := e.client.RequestCapability(ctx, tenant, api.CapabilityRequest{Capability: "teleport", InputContract: "a", OutputContract: "b",
		Reason: "c", Constraints: api.DefaultCapabilityConstraints()})
	if err != nil || none.Outcome != api.CapabilityRefused || none.Refusal == nil || none.Refusal.ECode != api.ECapabilityNoMatch {
		t.Fatalf("unmatched: %+v %v", none, err)
	}
	// Audited: each request and its outcome.
	// The reused id and the malformed request are refused and audited too.
	for sub, want := range map[string]int{"requested": 4, "granted": 1, "refused": 3, "matched": 0} {
		if n := e.count(subjects.StreamAudit, "audit."+tenant+".capability."+sub); n != want {
			t.Errorf("%d capability.%s audit events, want %d", n, sub, want)
		}
	}
}
