package toolgate.authz_test

import data.toolgate.authz

base := {
	"tenant": "acme",
	"request": {"agent_context": {"tenant_id": "acme"}},
	"tool": {"id": "t", "kind": "builtin", "safety": {"risk_level": "low"}},
	"claims": {},
	"usage": {"calls": 0, "runtime_ms": 0, "cost": 0, "tokens": 0, "consecutive_failures": 0},
	"resources": {"paths": [], "hosts": [], "credentials": []},
	"derived": {"pre_approved": false, "host_granted": {}},
}

with_tool(safety) := object.union(base, {"tool": {"id": "t", "kind": "builtin", "safety": safety}})

allowed(d) if {
	d.allow
	not d.requires_approval
}

needs_approval(d) if {
	d.allow
	d.requires_approval
}

denied(d, code) if {
	not d.allow
	d.code == code
}

test_low_risk_allowed if allowed(authz.decision) with input as base

test_medium_risk_allowed if allowed(authz.decision) with input as with_tool({"risk_level": "medium"})

test_missing_risk_is_low if allowed(authz.decision) with input as json.remove(base, ["tool/safety/risk_level"])

test_high_risk_needs_approval if needs_approval(authz.decision) with input as with_tool({"risk_level": "high"})

test_high_risk_pre_approved if {
	inp := object.union(with_tool({"risk_level": "HIGH"}), {"derived": {"pre_approved": true, "host_granted": {}}})
	allowed(authz.decision) with input as inp
}

test_critical_needs_approval_even_pre_approved if {
	inp := object.union(with_tool({"risk_level": "critical"}), {"derived": {"pre_approved": true, "host_granted": {}}})
	needs_approval(authz.decision) with input as inp
}

test_requires_approval_flag if needs_approval(authz.decision) with input as with_tool({"risk_level": "low", "requires_approval": true})

test_request_asks_for_approval if {
	inp := object.union(base, {"request": {"agent_context": {"tenant_id": "acme"}, "execution_options": {"require_approval": true}}})
	needs_approval(authz.decision) with input as inp
}

test_failures_need_approval if {
	inp := object.union(base, {
		"claims": {"budget": {"approval_after_failures": 3}},
		"usage": {"consecutive_failures": 3},
	})
	d := authz.decision with input as inp
	needs_approval(d)
	d.reasons == ["3 calls in a row failed in this session"]
}

test_failures_below_threshold if {
	inp := object.union(base, {"claims": {"budget": {"approval_after_failures": 3}}, "usage": {"consecutive_failures": 2}})
	allowed(authz.decision) with input as inp
}

test_approved_runs if {
	inp := object.union(with_tool({"risk_level": "critical"}), {"approval": {"state": "approved", "decided_by": "ops"}})
	allowed(authz.decision) with input as inp
}

test_denied_approval_still_asks if {
	inp := object.union(with_tool({"risk_level": "critical"}), {"approval": {"state": "denied", "decided_by": "ops"}})
	needs_approval(authz.decision) with input as inp
}

test_excluded_side_effect_exact if {
	inp := object.union(with_tool({"side_effects": ["fs.write"]}), {"claims": {"excluded_side_effects": ["fs.write"]}})
	denied(authz.decision, "E3209") with input as inp
}

test_excluded_side_effect_parent_tag if {
	inp := object.union(with_tool({"side_effects": ["fs.write.delete"]}), {"claims": {"excluded_side_effects": ["fs.write"]}})
	denied(authz.decision, "E3209") with input as inp
}

test_excluded_tag_is_not_a_string_prefix if {
	inp := object.union(with_tool({"side_effects": ["fs.writer"]}), {"claims": {"excluded_side_effects": ["fs.write"]}})
	allowed(authz.decision) with input as inp
}

test_excluded_sub_tag_does_not_exclude_parent if {
	inp := object.union(with_tool({"side_effects": ["fs.write"]}), {"claims": {"excluded_side_effects": ["fs.write.delete"]}})
	allowed(authz.decision) with input as inp
}

fs(paths, mode, needs) := object.union(base, {
	"claims": {"filesystem_permissions": {"allowed_paths": paths, "mode": mode}},
	"resources": {"paths": needs, "hosts": [], "credentials": []},
})

test_exact_path_grant if allowed(authz.decision) with input as fs(["/public/readme.txt"], "ro", [{"path": "/public/readme.txt", "mode": "ro"}])

test_path_under_grant if allowed(authz.decision) with input as fs(["/public"], "ro", [{"path": "/public/a/b.txt", "mode": "ro"}])

test_root_grant_covers_all if allowed(authz.decision) with input as fs(["/"], "ro", [{"path": "/x", "mode": "ro"}])

test_sibling_prefix_not_granted if denied(authz.decision, "E3203") with input as fs(["/public"], "ro", [{"path": "/publicity.txt", "mode": "ro"}])

test_exact_file_grant_not_a_directory if denied(authz.decision, "E3203") with input as fs(["/public/readme.txt"], "ro", [{"path": "/public/readme.txt.bak", "mode": "ro"}])

test_no_filesystem_grant if {
	inp := object.union(base, {"resources": {"paths": [{"path": "/x", "mode": "ro"}], "hosts": [], "credentials": []}})
	denied(authz.decision, "E3203") with input as inp
}

test_write_needs_rw if denied(authz.decision, "E3203") with input as fs(["/out"], "ro", [{"path": "/out/x", "mode": "rw"}])

test_write_mode_defaults_to_ro if {
	inp := object.union(base, {
		"claims": {"filesystem_permissions": {"allowed_paths": ["/out"]}},
		"resources": {"paths": [{"path": "/out/x", "mode": "rw"}], "hosts": [], "credentials": []},
	})
	denied(authz.decision, "E3203") with input as inp
}

test_write_with_rw if allowed(authz.decision) with input as fs(["/out"], "rw", [{"path": "/out/x", "mode": "rw"}])

net(ports, granted) := object.union(base, {
	"claims": {"network_permissions": {"allowed_ports": ports}},
	"resources": {"paths": [], "hosts": [{"host": "api.example.com", "port": 443}], "credentials": []},
	"derived": {"pre_approved": false, "host_granted": granted},
})

test_host_granted if allowed(authz.decision) with input as net([], {"api.example.com": true})

test_host_not_granted if denied(authz.decision, "E3204") with input as net([], {})

test_port_granted if allowed(authz.decision) with input as net([443], {"api.example.com": true})

test_port_not_granted if denied(authz.decision, "E3204") with input as net([80], {"api.example.com": true})

creds(granted) := object.union(base, {
	"claims": {"credential_permissions": {"allowed_secrets": granted}},
	"resources": {"paths": [], "hosts": [], "credentials": ["api_key"]},
})

test_credential_granted if allowed(authz.decision) with input as creds(["api_key"])

test_credential_not_granted if denied(authz.decision, "E3205") with input as creds(["other"])

budget(b, u) := object.union(base, {"claims": {"budget": b}, "usage": u})

test_max_calls_spent if denied(authz.decision, "E3211") with input as budget({"max_calls": 2}, {"calls": 2})

test_max_calls_left if allowed(authz.decision) with input as budget({"max_calls": 2}, {"calls": 1})

test_max_runtime_spent if denied(authz.decision, "E3211") with input as budget({"max_runtime_ms": 1000}, {"runtime_ms": 1000})

test_max_runtime_left if allowed(authz.decision) with input as budget({"max_runtime_ms": 1000}, {"runtime_ms": 999})

test_max_cost_would_pass if {
	inp := object.union(budget({"max_cost": 1}, {"cost": 0.5}), {"tool": {"id": "t", "kind": "builtin", "safety": {}, "cost": {"per_call": 0.6}}})
	denied(authz.decision, "E3211") with input as inp
}

test_max_cost_fits if {
	inp := object.union(budget({"max_cost": 1}, {"cost": 0.5}), {"tool": {"id": "t", "kind": "builtin", "safety": {}, "cost": {"per_call": 0.5}}})
	allowed(authz.decision) with input as inp
}

test_max_tokens_spent if {
	d := authz.decision with input as budget({"max_tokens": 100}, {"tokens": 100})
	denied(d, "E3211")
	d.reasons == ["the session has used 100 of its 100 tokens"]
}

test_max_tokens_left if allowed(authz.decision) with input as budget({"max_tokens": 100}, {"tokens": 99})

test_zero_limits_are_unlimited if allowed(authz.decision) with input as budget(
	{"max_calls": 0, "max_runtime_ms": 0, "max_cost": 0, "max_tokens": 0},
	{"calls": 9, "runtime_ms": 9, "cost": 9, "tokens": 9},
)

test_other_tenant_denied if {
	inp := object.union(base, {"request": {"agent_context": {"tenant_id": "evil"}}})
	denied(authz.decision, "E3209") with input as inp
}

test_allowed_kinds if {
	allowed(authz.decision) with input as base with data.toolgate.allowed_kinds as ["builtin"]
	denied(authz.decision, "E3209") with input as base with data.toolgate.allowed_kinds as ["http"]
}

test_blocked_tenant if denied(authz.decision, "E3209") with input as base with data.toolgate.blocked_tenants as ["acme"]

test_lowest_code_and_sorted_reasons if {
	inp := object.union(fs(["/a"], "ro", [{"path": "/b", "mode": "ro"}]), {"request": {"agent_context": {"tenant_id": "evil"}}})
	d := authz.decision with input as inp
	denied(d, "E3203")
	count(d.reasons) == 2
	d.reasons == sort(d.reasons)
}
