package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
)

func mustParse(t *testing.T, doc, source string) *Set {
	t.Helper()
	s, err := Parse([]byte(doc), source)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestParseRefuses: every hook that cannot run is refused at registration
// with E3800 and a field error that locates it; a condition's says where in
// the expression.
func TestParseRefuses(t *testing.T) {
	cases := []struct{ name, doc, loc, msg string }{
		{"unknown trigger", `{"hooks":[{"on":"sunrise","action":"fail"}]}`, "/hooks/0/on", ""},
		{"unknown action", `{"hooks":[{"on":"timeout","action":"explode"}]}`, "/hooks/0/action", ""},
		{"custom without condition", `{"hooks":[{"on":"custom","action":"fail"}]}`, "/hooks/0/condition", "needs a condition"},
		{"undeclared variable", `{"hooks":[{"on":"failure","action":"fail","condition":"error.code == \"x\" && secrets.x"}]}`,
			"/hooks/0/condition", "line 1, column 22"},
		{"syntax error", `{"hooks":[{"on":"failure","action":"fail","condition":"trigger ==\n  == 1"}]}`, "/hooks/0/condition", "line 2"},
		{"not a bool", `{"hooks":[{"on":"failure","action":"fail","condition":"1 + 2"}]}`, "/hooks/0/condition", "not bool"},
		{"fallback without target", `{"hooks":[{"on":"failure","action":"retry_with_fallback"}]}`, "/hooks/0/fallback", ""},
		{"fallback on retry", `{"hooks":[{"on":"failure","action":"retry","fallback":{"tool_id":"echo"}}]}`, "/hooks/0/fallback", ""},
		{"unknown template", `{"hooks":[{"on":"failure","action":"retry_with_fallback","fallback":{"tool_id":"echo","parameters":{"m":"${token.id}"}}}]}`,
			"/hooks/0/fallback/parameters", "names no variable"},
		{"duplicate name", `{"hooks":[{"name":"a","on":"failure","action":"fail"},{"name":"a","on":"timeout","action":"fail"}]}`, "/hooks/1/name", ""},
		{"too many attempts", `{"hooks":[{"on":"failure","action":"retry","max_attempts":50}]}`, "/hooks/0/max_attempts", ""},
		{"attempts on fail", `{"hooks":[{"on":"failure","action":"fail","max_attempts":2}]}`, "/hooks/0/max_attempts", ""},
		{"unknown field", `{"hooks":[{"on":"failure","action":"fail","when":"now"}]}`, "/hooks/0", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc), SourceTenant)
			var te *api.Error
			if !errors.As(err, &te) || te.ECode != api.EHookInvalid {
				t.Fatalf("got %v, want E3800", err)
			}
			found := false
			for _, f := range te.Fields {
				if strings.HasPrefix(f.Location, c.loc) && strings.Contains(f.Message, c.msg) {
					found = true
				}
			}
			if !found {
				t.Fatalf("no field error at %s containing %q: %+v", c.loc, c.msg, te.Fields)
			}
		})
	}
	if _, err := Parse([]byte(`{"hooks":[{"on":"failure","action":"fail","tools":["x"]}]}`), SourceManifest); err == nil {
		t.Fatal("a manifest hook with tools was accepted")
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		status  api.Status
		err     *api.Error
		trigger string
		ok      bool
	}{
		{api.StatusSuccess, nil, "", true},
		{api.StatusPermissionDenied, api.NewError(api.PermissionDenied, api.EPolicyDenied, ""), OnPermissionDenied, true},
		{api.StatusTimeout, api.NewError(api.Timeout, api.ETimeout, ""), OnTimeout, true},
		{api.StatusError, api.NewError(api.ToolExecutionError, api.EToolFailed, ""), OnFailure, true},
		{api.StatusError, api.NewError(api.ResourceExhausted, api.EBudgetExhausted, ""), OnBudgetExceeded, true},
		{api.StatusError, api.NewError(api.RateLimitExceeded, api.ERateLimited, ""), OnRateLimited, true},
		{api.StatusError, api.NewError(api.CircuitBreakerOpen, api.EBreakerOpen, ""), OnCircuitOpen, true},
		{api.StatusCancelled, api.NewError(api.Cancelled, api.ECancelled, ""), "", false},
		{api.StatusPermissionDenied, api.NewError(api.PermissionDenied, api.ESessionAborted, ""), "", false},
		{api.StatusError, api.NewError(api.ResourceExhausted, api.EHookLimit, ""), "", false},
		{api.StatusError, api.NewError(api.InvalidParameters, api.EDuplicateInvocation, ""), "", false},
	}
	for _, c := range cases {
		trigger, ok := Classify(c.status, c.err)
		if trigger != c.trigger || ok != c.ok {
			t.Errorf("%s %v: got %q %v, want %q %v", c.status, c.err, trigger, ok, c.trigger, c.ok)
		}
	}
}

func TestDecide(t *testing.T) {
	manifest := mustParse(t, `{"hooks":[
	  {"name":"big","on":"failure","condition":"error.e_code == 'E3108' && invocation.parameters.size > 10","action":"skip"},
	  {"name":"again","on":"failure","action":"retry","max_attempts":2}]}`, SourceManifest)
	tenant := mustParse(t, `{"hooks":[
	  {"name":"broken","on":"custom","condition":"result.missing.field == 1","action":"fail"},
	  {"name":"spend","on":"custom","condition":"usage.cost > 0.5 && status == 'success'","action":"abort","tools":["paid.*"]},
	  {"name":"slow","on":"timeout","action":"continue"}]}`, SourceTenant)
	out := func(trigger string, params string, ecode string) Outcome {
		var p any
		_ = json.Unmarshal([]byte(params), &p)
		return Outcome{
			Invocation: map[string]any{"parameters": p}, Trigger: trigger, Status: "error",
			Error: map[string]any{"e_code": ecode}, Usage: map[string]any{"cost": 0.75}, Result: map[string]any{},
		}
	}
	ctx := context.Background()
	m, _ := Decide(ctx, out(OnFailure, `{"size":20}`, "E3108"), "t", nil, manifest, tenant)
	if m == nil || m.Spec.Name != "big" {
		t.Fatalf("got %+v, want big", m)
	}
	m, _ = Decide(ctx, out(OnFailure, `{"size":2}`, "E3108"), "t", nil, manifest, tenant)
	if m == nil || m.Spec.Name != "again" || m.Attempt != 1 {
		t.Fatalf("got %+v, want again attempt 1", m)
	}
	m, _ = Decide(ctx, out(OnFailure, `{"size":2}`, "E3108"), "t", &api.Link{Hook: "again", Attempt: 1}, manifest, tenant)
	if m == nil || m.Spec.Name != "again" || m.Attempt != 2 {
		t.Fatalf("got %+v, want again attempt 2", m)
	}
	// Spent: the tenant's hooks come next; "broken" fails at run time and
	// counts as false, "spend" applies only to paid.* tools.
	m, errs := Decide(ctx, out(OnFailure, `{"size":2}`, "E3108"), "t", &api.Link{Hook: "again", Attempt: 2}, manifest, tenant)
	if m != nil || len(errs) != 1 || !strings.Contains(errs[0], "broken") {
		t.Fatalf("got %+v %v, want no match and one condition error", m, errs)
	}
	o := out("", `{}`, "")
	o.Status = "success"
	m, _ = Decide(ctx, o, "paid.search", nil, manifest, tenant)
	if m == nil || m.Spec.Name != "spend" || m.Source != SourceTenant {
		t.Fatalf("got %+v, want spend", m)
	}
	if m, _ := Decide(ctx, out(OnTimeout, `{}`, "E3103"), "t", nil, manifest, tenant); m == nil || m.Spec.Name != "slow" {
		t.Fatalf("got %+v, want slow", m)
	}
}

// TestCostLimit: a condition that would run long is stopped by the cost
// limit and counts as false, with an error.
func TestCostLimit(t *testing.T) {
	s := mustParse(t, `{"hooks":[{"on":"custom","action":"fail",
	  "condition":"invocation.parameters.xs.all(a, invocation.parameters.xs.all(b, invocation.parameters.xs.all(c, a + b + c >= 0)))"}]}`, SourceManifest)
	xs := make([]any, 200)
	for i := range xs {
		xs[i] = float64(i)
	}
	m, errs := Decide(context.Background(), Outcome{Invocation: map[string]any{"parameters": map[string]any{"xs": xs}}}, "t", nil, s)
	if m != nil || len(errs) != 1 || !strings.Contains(errs[0], "cost") {
		t.Fatalf("got %+v %v, want a cost limit error", m, errs)
	}
}

func TestRender(t *testing.T) {
	o := Outcome{
		Invocation: map[string]any{"tool_id": "fs.read_file", "parameters": map[string]any{"path": "a.txt", "n": 3.0}},
		Error:      map[string]any{"code": "timeout"},
	}
	out, missing, err := Render(json.RawMessage(`{"message":"${invocation.tool_id} failed: ${error.code} (${nope.x})","n":"${invocation.parameters.n}",
	  "p":"${invocation.parameters}","gone":"${usage.cost}","list":["${invocation.parameters.path}"]}`), o)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got["message"] != "fs.read_file failed: timeout ()" || got["n"] != 3.0 || got["gone"] != nil ||
		got["list"].([]any)[0] != "a.txt" || got["p"].(map[string]any)["path"] != "a.txt" {
		t.Fatalf("rendered %s", out)
	}
	if strings.Join(missing, ",") != "nope.x,usage.cost" && strings.Join(missing, ",") != "usage.cost,nope.x" {
		t.Fatalf("missing %v", missing)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"hooks":[{"on":"failure","action":"retry","condition":"error.code == 'x'"}]}`))
	f.Add([]byte(`{"hooks":[{"on":"custom","action":"retry_with_fallback","condition":"true","fallback":{"tool_id":"e","parameters":{"a":"${x"}}}]}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		s, err := Parse(doc, SourceTenant)
		if err != nil {
			return
		}
		Decide(context.Background(), Outcome{}, "t", nil, s)
		for _, h := range s.Specs {
			if h.Fallback != nil && len(h.Fallback.Parameters) > 0 {
				_, _, _ = Render(h.Fallback.Parameters, Outcome{})
			}
		}
	})
}
