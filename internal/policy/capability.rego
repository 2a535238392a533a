# toolgate's shipped capability grant policy.
#
# When an agent's capability request (seed 003) matches registered tools,
# the control service evaluates data.toolgate.capability.grant with:
#
#   input.request     the capability request: capability, input_contract,
#                     output_contract, reason, constraints {no_network,
#                     read_only_input, max_runtime_ms, max_memory_mb}
#   input.candidates  the matched tools, best first: {tool_id, version,
#                     kind, risk_level, side_effects, requires_approval,
#                     cost_per_call}
#   input.claims      the agent's verified token claims (the parent)
#   input.tenant      the tenant of the subject
#   input.time        the evaluation time, RFC 3339
#
# and expects {"allow": bool, "reasons": [string], "tools": [tool_id],
# "max_calls": n, "max_runtime_ms": n, "max_cost": x, "ttl_seconds": n}.
# The child token names exactly "tools" (a subset of the candidates) within
# the request's constraints; the budget and lifetime never exceed the
# parent's (toolgate narrows them again). Anything else, including an
# undefined grant, grants nothing. Override it in the policy you push.
package toolgate.capability

# The defaults of seed 003's per-session budget.
default_max_calls := 4

default_max_runtime_ms := 30000

default_ttl_seconds := 900

default grant := {"allow": false, "reasons": ["no rule granted the request"], "tools": []}

# Tools granted without a human: low or medium risk, no approval required,
# no payments or deletions.
grantable contains c.tool_id if {
	some c in input.candidates
	c.risk_level in {"low", "medium"}
	not c.requires_approval
	not forbidden_effect(c)
}

forbidden_effect(c) if {
	some e in c.side_effects
	some f in {"payments", "fs.delete", "cloud.resource_delete", "database.delete"}
	startswith(e, f)
}

grant := {
	"allow": true,
	"reasons": [],
	"tools": sort([t | some t in grantable]),
	"max_calls": default_max_calls,
	"max_runtime_ms": max({input.request.constraints.max_runtime_ms * default_max_calls, default_max_runtime_ms}),
	"ttl_seconds": default_ttl_seconds,
} if count(grantable) > 0

grant := {
	"allow": false,
	"reasons": sort([sprintf("%s is %s risk or needs approval", [c.tool_id, c.risk_level]) | some c in input.candidates]),
	"tools": [],
} if {
	count(input.candidates) > 0
	count(grantable) == 0
}
