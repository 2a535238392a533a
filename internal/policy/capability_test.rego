package toolgate.capability_test

import data.toolgate.capability

request := {"capability": "parse_json", "constraints": {"no_network": true, "read_only_input": true, "max_runtime_ms": 1000, "max_memory_mb": 64}}

cand(id, risk) := {"tool_id": id, "version": "1.0.0", "kind": "builtin", "risk_level": risk, "side_effects": [], "requires_approval": false}

test_low_risk_granted if {
	g := capability.grant with input as {"request": request, "candidates": [cand("parse.json", "low")]}
	g.allow
	g.tools == ["parse.json"]
	g.max_calls == 4
	g.max_runtime_ms == 30000
}

test_only_safe_candidates_granted if {
	g := capability.grant with input as {"request": request, "candidates": [cand("a", "high"), cand("b", "medium"), cand("c", "critical")]}
	g.tools == ["b"]
}

test_high_risk_refused if {
	g := capability.grant with input as {"request": request, "candidates": [cand("a", "high")]}
	not g.allow
	count(g.reasons) == 1
}

test_approval_refused if {
	c := object.union(cand("a", "low"), {"requires_approval": true})
	g := capability.grant with input as {"request": request, "candidates": [c]}
	not g.allow
}

test_payments_refused if {
	c := object.union(cand("a", "low"), {"side_effects": ["payments.card"]})
	g := capability.grant with input as {"request": request, "candidates": [c]}
	not g.allow
}

test_no_candidates_refused if {
	g := capability.grant with input as {"request": request, "candidates": []}
	not g.allow
}

test_runtime_budget_follows_request if {
	r := object.union(request, {"constraints": {"max_runtime_ms": 20000}})
	g := capability.grant with input as {"request": r, "candidates": [cand("a", "low")]}
	g.max_runtime_ms == 80000
}
