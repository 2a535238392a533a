package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
)

// unkept is e without its memo: every call evaluated.
func unkept(e *Engine) *Engine {
	c := *e
	c.memo = nil
	return &c
}

// memoPolicies are policies beside the shipped one that read the input in
// the ways a memo must follow: through an import, a function, a computed
// key, iteration, numbers shown as written, null against absent, data.
var memoPolicies = map[string]string{
	"import": `package toolgate.authz
import input.request.agent_context as ac
decision := {"allow": ac.tenant_id == input.tenant, "reasons": ["tenant"]}`,
	"function": `package toolgate.authz
risk(t) := object.get(t, ["safety", "risk_level"], "none")
decision := {"allow": risk(input.tool) in {"low", "medium"}, "reasons": [risk(input.tool)]}`,
	"computed key": `package toolgate.authz
decision := {"allow": true} if input.derived.host_granted[input.tenant]
else := {"allow": false, "reasons": [input.tenant]}`,
	"iteration": `package toolgate.authz
decision := {"allow": count(bad) == 0, "reasons": sort(bad)}
bad contains sprintf("%v:%v", [k, v]) if { some k, v in input.usage; v != 0 }`,
	"numbers as written": `package toolgate.authz
decision := {"allow": false, "reasons": [sprintf("%v %v", [input.usage.cost, object.get(input.tool, ["cost", "per_call"], "none")])], "approvers": input.usage.calls}`,
	"null or absent": `package toolgate.authz
decision := {"allow": true, "reasons": ["null"]} if input.approval == null
else := {"allow": true, "reasons": ["absent"]} if not input.approval
else := {"allow": false, "reasons": [sprintf("%v", [input.approval.state])]}`,
	"deep and shallow": `package toolgate.authz
decision := {"allow": input.request.execution_options.require_approval == true}`,
	"data": `package toolgate.authz
decision := {"allow": input.tenant in data.tenants, "reasons": [sprintf("%v", [data.limits[input.tool.kind]])]}`,
	"input whole": `package toolgate.authz
decision := {"allow": count(input) > 9, "reasons": [sprintf("%d", [count(input)])]}`,
	"input by computed root key": `package toolgate.authz
decision := {"allow": true, "reasons": [sprintf("%v", [input[k]])]} if some k in {"tenant", "time"}`,
	"object.get along a path": `package toolgate.authz
decision := {"allow": object.get(input.claims, ["filesystem_permissions", "mode"], "ro") == "rw",
	"reasons": [sprintf("%v %v %v", [object.get(input.claims, "excluded_side_effects", "none"),
		object.get(input.claims.budget, ["max_calls"], -1), object.get(input.tool, [], "none")])]}`,
	"object.get along a computed path": `package toolgate.authz
decision := {"allow": true, "reasons": sort(seen)}
seen contains sprintf("%s=%v", [k, object.get(input.claims, [k], "none")]) if some k in ["jti", "budget"]`,
	"claims by name": `package toolgate.authz
decision := {"allow": object.get(input.claims, "mode", "ro") == "ro", "reasons": [sprintf("%v", [input.claims.jti])]}`,
}

var memoData = map[string]any{"tenants": []any{"acme"}, "limits": map[string]any{"builtin": 1, "http": 2.5},
	"toolgate":  map[string]any{"allowed_kinds": []any{"builtin"}, "blocked_tenants": []any{"blocked"}},
	"approvals": map[string]any{"approvers_by_risk": map[string]any{"critical": 2, "high": 3}}}

// pick returns one of vs; absent (nil with ok false) where vs holds the
// absent marker.
type absent struct{}

func pick(r *rand.Rand, vs ...any) any { return vs[r.IntN(len(vs))] }

// set puts v at k in m unless v is the absent marker.
func set(m map[string]any, k string, v any) {
	if _, skip := v.(absent); !skip {
		m[k] = v
	}
}

// genInput is a decision input drawn from small sets of values, so that
// many share what a policy reads, beside parts no policy reads (the id,
// the parameters, the time) that differ on every call. Every branch of the
// shipped policy is among them: refusals of each code, approvals, budgets,
// missing fields and values of unusual types.
func genInput(r, free *rand.Rand, i int) map[string]any {
	var none absent
	agent := map[string]any{"agent_did": "did:agent:a"}
	set(agent, "tenant_id", pick(r, "acme", "acme", "acme", "acme", "other", none, 5, nil))
	req := map[string]any{"tool_id": "t", "invocation_id": fmt.Sprintf("inv-%d", i),
		"parameters": map[string]any{"text": fmt.Sprint(free.Int()), "n": free.IntN(3)}, "agent_context": agent}
	set(req, "execution_options", pick(r, none, none, none, map[string]any{}, map[string]any{"require_approval": true},
		map[string]any{"require_approval": false}, map[string]any{"require_approval": "yes"}, nil, "x", true))
	safety := map[string]any{}
	set(safety, "risk_level", pick(r, "low", "medium", "high", "critical", "HIGH", none, 3))
	set(safety, "requires_approval", pick(r, none, none, true, false))
	set(safety, "side_effects", pick(r, none, []any{}, []any{"fs.write"}, []any{"payments.card", "net"}, []any{"fsx"}))
	tool := map[string]any{"id": pick(r, "t", "u"), "version": "1.0.0"}
	set(tool, "kind", pick(r, "builtin", "http", none, 7))
	set(tool, "safety", pick(r, safety, safety, none, nil))
	set(tool, "cost", pick(r, none, none, map[string]any{"per_call": 0.5}, map[string]any{"per_call": json.Number("1.0")}, map[string]any{"per_call": 1}))
	// A token's id and times differ from call to call where each call
	// brings a token minted for it; what it grants is drawn like the rest.
	claims := map[string]any{"tool_id": []any{"*"}, "tenant_id": "acme", "jti": pick(free, "tok-1", fmt.Sprint("tok-", i)),
		"iat": 1796011308 + free.IntN(2)*i, "exp": 1796097708 + free.IntN(2)*i}
	set(claims, "budget", pick(r, none, none, map[string]any{}, map[string]any{"max_calls": 3, "approval_after_failures": 2},
		map[string]any{"max_runtime_ms": 100, "max_cost": 1, "max_tokens": 10}, map[string]any{"max_calls": "3"}, "3", nil))
	set(claims, "excluded_side_effects", pick(r, none, []any{"fs"}, []any{"payments"}, []any{}, "fs"))
	set(claims, "filesystem_permissions", pick(r, none, map[string]any{"allowed_paths": []any{"/data"}, "mode": "rw"},
		map[string]any{"allowed_paths": []any{"/"}}, map[string]any{"allowed_paths": []any{"/data/x"}, "mode": "ro"},
		map[string]any{"mode": nil}, "rw", []any{"rw"}, nil))
	set(claims, "network_permissions", pick(r, none, map[string]any{"allowed_ports": []any{443}}, map[string]any{"allowed_ports": []any{}},
		map[string]any{"allowed_ports": 443}, 443))
	set(claims, "credential_permissions", pick(r, none, map[string]any{"allowed_secrets": []any{"k"}}, []any{"k"}))
	usage := map[string]any{}
	set(usage, "calls", pick(r, 0, 0, 3, 5, json.Number("3.0")))
	set(usage, "runtime_ms", pick(r, 0, 0, 100))
	set(usage, "cost", pick(r, 0, 0, 0.5, 1, json.Number("1.0")))
	set(usage, "tokens", pick(r, 0, 0, 10, none))
	set(usage, "consecutive_failures", pick(r, 0, 0, 2, 3))
	res := map[string]any{
		"paths":       pick(r, []any{}, []any{}, []any{}, []any{}, []any{map[string]any{"path": "/data/x", "mode": "rw"}}, []any{map[string]any{"path": "/etc", "mode": "ro"}}, nil),
		"hosts":       pick(r, []any{}, []any{}, []any{}, []any{}, []any{map[string]any{"host": "a.com", "port": 443}}, []any{map[string]any{"host": "b.com", "port": 0}}),
		"credentials": pick(r, []any{}, []any{}, []any{}, []any{}, []any{"k"}, []any{"z"}),
	}
	derived := map[string]any{"pre_approved": pick(r, false, false, true),
		"host_granted": pick(r, map[string]any{}, map[string]any{"a.com": true}, map[string]any{"acme": true}, nil)}
	in := map[string]any{"request": req, "claims": claims, "usage": usage, "resources": res, "derived": derived,
		"time": time.Unix(int64(i), 0).UTC().Format(time.RFC3339)}
	set(in, "tool", pick(r, tool, tool, tool, none))
	set(in, "tenant", pick(r, "acme", "acme", "acme", "acme", "other", "blocked", none))
	set(in, "approval", pick(r, none, none, none, nil, map[string]any{"state": "approved", "decided_by": fmt.Sprint("u", free.IntN(3))},
		map[string]any{"state": "denied"}, map[string]any{}))
	return in
}

// genInputs draws n inputs, half of them of one of 40 shapes (what the
// generator chose for every part but the id, the parameters, the time and
// the approver), so that a memo has decisions to read back.
func genInputs(seed uint64, n int) []map[string]any {
	r := rand.New(rand.NewPCG(seed, 1))
	ins := make([]map[string]any, n)
	for i := range ins {
		shape := r
		if r.IntN(2) == 0 {
			shape = rand.New(rand.NewPCG(seed, 2+uint64(r.IntN(40))))
		}
		ins[i] = genInput(shape, r, i)
	}
	return ins
}

// TestMemoDecidesAsTheFullEvaluation: over thousands of generated inputs,
// for the shipped policy and policies reading the input in other ways,
// with and without data, the decision an Engine gives (read back from its
// memo where it can) is the one a full evaluation of each call gives.
func TestMemoDecidesAsTheFullEvaluation(t *testing.T) {
	ctx := context.Background()
	policies := map[string]string{"shipped": DefaultModule()}
	for name, src := range memoPolicies {
		policies[name] = src
	}
	n := 3000
	if testing.Short() {
		n = 500
	}
	for name, src := range policies {
		for _, data := range []map[string]any{nil, memoData} {
			t.Run(fmt.Sprintf("%s/data=%v", name, data != nil), func(t *testing.T) {
				e, err := New(ctx, map[string]string{"p.rego": src}, data)
				if err != nil {
					t.Fatal(err)
				}
				full := unkept(e)
				decided := map[string]int{}
				for i, plain := range genInputs(uint64(len(name)), n) {
					in, err := ast.InterfaceToValue(plain)
					if err != nil {
						t.Fatal(err)
					}
					got, err1 := e.Eval(ctx, in)
					want, err2 := full.Eval(ctx, in)
					if (err1 != nil) != (err2 != nil) || !reflect.DeepEqual(got, want) {
						t.Fatalf("input %d %v:\nmemo %+v (%v)\nfull %+v (%v)", i, in, got, err1, want, err2)
					}
					decided[fmt.Sprintf("allow=%v approval=%v code=%s", want.Allow, want.RequiresApproval, want.Code)]++
				}
				if e.memo != nil {
					t.Logf("%d decisions read back of %d; outcomes %v", e.memo.hits, n, decided)
				}
			})
		}
	}
}

// TestMemoCoversThePolicies: the shipped policy's decisions are kept, and
// those of policies that read the input whole, by a computed key at its
// root, under with, or call what the clock or chance decides, are not.
func TestMemoCoversThePolicies(t *testing.T) {
	ctx := context.Background()
	for name, c := range map[string]struct {
		src  string
		kept bool
	}{
		"shipped":           {DefaultModule(), true},
		"import":            {memoPolicies["import"], true},
		"object.get":        {memoPolicies["object.get along a path"], true},
		"object.get, var":   {memoPolicies["object.get along a computed path"], true},
		"input whole":       {memoPolicies["input whole"], false},
		"root key":          {memoPolicies["input by computed root key"], false},
		"with":              {"package toolgate.authz\nok if input.tenant == \"acme\"\ndecision := {\"allow\": x} if x := ok with input.tenant as \"acme\"", false},
		"time":              {"package toolgate.authz\ndecision := {\"allow\": time.now_ns() > input.usage.calls}", false},
		"nested time":       {"package toolgate.authz\nf(x) := x + time.now_ns()\ndecision := {\"allow\": f(1) > 0}", false},
		"random":            {"package toolgate.authz\ndecision := {\"allow\": rand.intn(\"x\", 2) == 0}", false},
		"uuid":              {"package toolgate.authz\ndecision := {\"allow\": true, \"reasons\": [uuid.rfc4122(input.tenant)]}", false},
		"certificate clock": {"package toolgate.authz\ndecision := {\"allow\": v} if [v, _] := crypto.x509.parse_and_verify_certificates(input.tenant)", false},
	} {
		e, err := New(ctx, map[string]string{"p.rego": c.src}, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if kept := e.memo != nil; kept != c.kept {
			t.Errorf("%s: decisions kept %v, want %v", name, kept, c.kept)
		}
	}
}

// TestClockIsNeverFrozen: a policy whose decision shows time.now_ns is
// evaluated on every call, however alike the inputs.
func TestClockIsNeverFrozen(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx, map[string]string{"p.rego": "package toolgate.authz\ndecision := {\"allow\": false, \"reasons\": [sprintf(\"%d\", [time.now_ns()])]} if input.tenant"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := ast.MustInterfaceToValue(map[string]any{"tenant": "acme"})
	first, err := e.Eval(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	second, err := e.Eval(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(first.Reasons, second.Reasons) {
		t.Fatalf("two calls 2 ms apart saw the same time %v: the clock was frozen", first.Reasons)
	}
}

// TestMemoKeepsNoCallerChanges: a caller appending to a kept decision's
// reasons does not change what the next call reads back.
func TestMemoKeepsNoCallerChanges(t *testing.T) {
	ctx := context.Background()
	e, err := Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := ast.MustInterfaceToValue(map[string]any{"tenant": "acme", "request": map[string]any{"agent_context": map[string]any{"tenant_id": "other"}}})
	d, _ := e.Eval(ctx, in)
	want := fmt.Sprint(d.Reasons)
	d.Reasons = append(d.Reasons, "x")
	d2, _ := e.Eval(ctx, in)
	d2.Reasons = append(d2.Reasons, "y")
	if d3, _ := e.Eval(ctx, in); fmt.Sprint(d3.Reasons) != want || e.memo.hits != 2 {
		t.Fatalf("reasons read back %v after %d hits, want %v", d3.Reasons, e.memo.hits, want)
	}
}

// TestMemoReadsBackFreshTokens: with the shipped policy, a call whose
// token was minted for it is read back when an earlier token granted the
// same (the claims differ in their id and times only, the manifest in its
// version, none of which the policy reads), and evaluated when what it
// grants differs where the policy looks.
func TestMemoReadsBackFreshTokens(t *testing.T) {
	ctx := context.Background()
	e, err := Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	call := func(jti string, exp int, mode string) Decision {
		t.Helper()
		in := ast.MustInterfaceToValue(map[string]any{"tenant": "acme",
			"request":   map[string]any{"agent_context": map[string]any{"tenant_id": "acme"}},
			"tool":      map[string]any{"id": "x", "kind": "builtin", "version": jti, "safety": map[string]any{"risk_level": "low"}},
			"resources": map[string]any{"paths": []any{map[string]any{"path": "/data", "mode": "rw"}}},
			"claims": map[string]any{"tool_id": []any{"*"}, "tenant_id": "acme", "jti": jti, "iat": exp - 60, "exp": exp,
				"filesystem_permissions": map[string]any{"allowed_paths": []any{"/"}, "mode": mode}}})
		d, err := e.Eval(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	first := call("tok-1", 1000, "ro")
	if first.Allow || first.Code != "E3203" {
		t.Fatalf("a read-only token writing a path: %+v, want refused E3203", first)
	}
	if d := call("tok-2", 2000, "ro"); !reflect.DeepEqual(d, first) || e.memo.hits != 1 {
		t.Fatalf("a second token granting the same: %+v after %d hits, want %+v read back", d, e.memo.hits, first)
	}
	if d := call("tok-3", 3000, "rw"); !d.Allow || e.memo.hits != 1 {
		t.Fatalf("a token granting writes: %+v after %d hits, want allowed, evaluated", d, e.memo.hits)
	}
}

// fuzzEngines are the policies FuzzMemoDecidesAsTheFullEvaluation runs,
// made once so that each keeps the decisions of earlier inputs.
var fuzzEngines = sync.OnceValue(func() []*Engine {
	var es []*Engine
	for _, src := range []string{DefaultModule(), memoPolicies["null or absent"], memoPolicies["deep and shallow"],
		memoPolicies["numbers as written"], memoPolicies["iteration"], memoPolicies["computed key"]} {
		for _, data := range []map[string]any{nil, memoData} {
			e, err := New(context.Background(), map[string]string{"p.rego": src}, data)
			if err != nil {
				panic(err)
			}
			es = append(es, e)
		}
	}
	return es
})

// FuzzMemoDecidesAsTheFullEvaluation: on any JSON object as input, an
// Engine's decision, read back or evaluated, is the full evaluation's.
func FuzzMemoDecidesAsTheFullEvaluation(f *testing.F) {
	for _, in := range genInputs(7, 40) {
		b, err := json.Marshal(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(len(b)))
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, doc []byte, which uint8) {
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		var in map[string]any
		if dec.Decode(&in) != nil || in == nil {
			return
		}
		v, err := ast.InterfaceToValue(in)
		if err != nil {
			return
		}
		es := fuzzEngines()
		e := es[int(which)%len(es)]
		got, err1 := e.Eval(ctx, v)
		want, err2 := unkept(e).Eval(ctx, v)
		if (err1 != nil) != (err2 != nil) || !reflect.DeepEqual(got, want) {
			t.Fatalf("input %s:\nmemo %+v (%v)\nfull %+v (%v)", doc, got, err1, want, err2)
		}
	})
}

// TestReads: a part of the input is unread only when no rule can reach it.
func TestReads(t *testing.T) {
	ctx := context.Background()
	shipped, err := Default(ctx)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := New(ctx, map[string]string{"p.rego": memoPolicies["input whole"]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	params, err := New(ctx, map[string]string{"p.rego": "package toolgate.authz\ndecision := {\"allow\": input.request.parameters.text != \"secret\"}"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	computed, err := New(ctx, map[string]string{"p.rego": memoPolicies["object.get along a computed path"]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		e    *Engine
		path []string
		want bool
	}{
		{shipped, []string{"request", "parameters"}, false},
		{shipped, []string{"request", "invocation_id"}, false},
		{shipped, []string{"time"}, false},
		{shipped, []string{"request"}, true},
		{shipped, []string{"request", "agent_context"}, true},
		{shipped, []string{"request", "agent_context", "tenant_id", "x"}, true},
		{shipped, []string{"tool", "safety", "risk_level"}, true},
		// The shipped policy reads the claims through object.get along
		// paths: a token's id and times are not read.
		{shipped, []string{"claims", "jti"}, false},
		{shipped, []string{"claims", "exp"}, false},
		{shipped, []string{"claims", "filesystem_permissions", "mode"}, true},
		{shipped, []string{"claims", "budget"}, true},
		{shipped, []string{"claims"}, true},
		{shipped, []string{"tool", "cost", "per_call"}, true},
		{shipped, []string{"tool", "version"}, false},
		{whole, []string{"request", "parameters"}, true},
		{params, []string{"request", "parameters"}, true},
		{params, []string{"request", "parameters", "text"}, true},
		{params, []string{"request", "tool_id"}, false},
		{computed, []string{"claims", "jti"}, true},
	} {
		if got := c.e.Reads(c.path...); got != c.want {
			t.Errorf("%v: Reads(%v) = %v, want %v", c.e.memo != nil, c.path, got, c.want)
		}
	}
}

// TestMemoBounded: the memo keeps at most maxMemoDecisions decisions and
// at most maxMemoCollisions under one hash.
func TestMemoBounded(t *testing.T) {
	m := &memo{reads: [][]*ast.Term{{ast.StringTerm("tenant")}}, shared: []int{0}}
	for i := range 20 {
		key, _ := m.key(ast.MustInterfaceToValue(map[string]any{"tenant": fmt.Sprint(i)}), nil)
		m.put(key, 1, Decision{Allow: true})
	}
	if len(m.m[1]) != maxMemoCollisions {
		t.Fatalf("%d decisions under one hash", len(m.m[1]))
	}
	for i := range maxMemoDecisions + 10 {
		key, h := m.key(ast.MustInterfaceToValue(map[string]any{"tenant": fmt.Sprint(i)}), nil)
		m.put(key, h, Decision{Allow: true})
	}
	if m.n > maxMemoDecisions {
		t.Fatalf("%d decisions kept", m.n)
	}
	key, h := m.key(ast.MustInterfaceToValue(map[string]any{"tenant": "x"}), nil)
	if _, ok := m.get(key, h); ok {
		t.Fatal("a decision never kept was read back")
	}
}

// TestKeyAsWalkedFromTheInput: a key, whose paths sharing their first
// names look those up once, holds what walking each path from the input
// finds, for every policy kept and inputs of every shape.
func TestKeyAsWalkedFromTheInput(t *testing.T) {
	policies := map[string]string{"shipped": DefaultModule(), "nested": `package toolgate.authz
decision := {"allow": input.a.b.c == input.a.b.d, "reasons": [input.a.e, input.a.b.f.g, input.a.b.f.h, input.x]}`}
	for name, src := range memoPolicies {
		policies[name] = src
	}
	inputs := genInputs(7, 400)
	inputs = append(inputs, []map[string]any{
		{"a": map[string]any{"b": map[string]any{"c": 1, "f": map[string]any{"h": 2}}, "e": 3}},
		{"a": map[string]any{"b": "scalar", "e": map[string]any{}}},
		{"a": map[string]any{"b": map[string]any{"f": nil}}},
		{"a": nil, "x": 1}, {},
	}...)
	for name, src := range policies {
		e, err := New(context.Background(), map[string]string{"p.rego": src}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if e.memo == nil {
			continue
		}
		for i, plain := range inputs {
			in, err := ast.InterfaceToValue(plain)
			if err != nil {
				t.Fatal(err)
			}
			got, gh := e.memo.key(in, nil)
			want, wh := walkedKey(e.memo.reads, in, nil)
			if gh != wh || len(got) != len(want) || !sameReads(got, want) {
				t.Fatalf("%s, input %d: key %v (%d), walked from the input %v (%d)", name, i, got, gh, want, wh)
			}
		}
	}
}

// walkedKey is memo.key walking every path from the input.
func walkedKey(reads [][]*ast.Term, input ast.Value, key []readValue) ([]readValue, int) {
	h := 0
	for _, p := range reads {
		v, depth := input, 0
		for _, name := range p {
			obj, isObj := v.(ast.Object)
			if !isObj {
				break
			}
			t := obj.Get(name)
			depth++
			if t == nil {
				v = nil
				break
			}
			v = t.Value
		}
		key = append(key, readValue{depth: depth, v: v})
		h = h*31 + depth
		if v != nil {
			h = h*31 + v.Hash()
		}
	}
	return key, h
}

// BenchmarkKey is the shipped policy's memo key of a call's input, read
// as key does and as walking every path from the input would.
func BenchmarkKey(b *testing.B) {
	e, err := Default(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	in, err := ast.InterfaceToValue(genInputs(1, 1)[0])
	if err != nil {
		b.Fatal(err)
	}
	var buf [32]readValue
	b.Run("shared", func(b *testing.B) {
		for b.Loop() {
			e.memo.key(in, buf[:0])
		}
	})
	b.Run("walked", func(b *testing.B) {
		for b.Loop() {
			walkedKey(e.memo.reads, in, buf[:0])
		}
	})
}
