# toolgate's shipped authorization policy.
#
# The authorize stage evaluates data.toolgate.authz.decision for every
# invocation with this input:
#
#   input.request  the ToolInvokeRequest (without its capability token)
#   input.tool     the tool manifest of the version being called
#   input.tenant   the tenant the event was published for
#   input.time     the evaluation time, RFC 3339
#
# and expects {"allow": bool, "reasons": [string], "requires_approval": bool}.
# Anything else, including an undefined decision, is a denial. Copy this file
# to write your own, and load it with `toolgate serve --policy FILE`.
package toolgate.authz

# Deny unless a rule below allows.
default decision := {"allow": false, "reasons": ["no rule allowed the call"]}

decision := {"allow": true, "reasons": []} if count(deny) == 0

decision := {
	"allow": false,
	"reasons": sort([r | some r in deny]),
	"requires_approval": approval_only,
} if count(deny) > 0

# Risk levels high and critical need a human's approval; this deployment does
# not grant approvals, so such calls are denied and marked as awaiting one.
approval contains msg if {
	input.tool.safety.risk_level in {"high", "critical"}
	msg := sprintf("tool %s has risk level %s, which requires human approval", [input.tool.id, input.tool.safety.risk_level])
}

approval contains msg if {
	input.tool.safety.requires_approval
	msg := sprintf("tool %s requires human approval", [input.tool.id])
}

approval contains "the request asks for human approval" if {
	input.request.execution_options.require_approval
}

# Tenant isolation: an agent acts only for its own tenant.
refusal contains msg if {
	input.request.agent_context.tenant_id != input.tenant
	msg := sprintf("agent of tenant %s may not act for tenant %s", [input.request.agent_context.tenant_id, input.tenant])
}

# Operators may restrict tool kinds with data.toolgate.allowed_kinds.
refusal contains msg if {
	allowed := data.toolgate.allowed_kinds
	not input.tool.kind in allowed
	msg := sprintf("tools of kind %s are not allowed here", [input.tool.kind])
}

# Operators may block tenants with data.toolgate.blocked_tenants.
refusal contains msg if {
	input.tenant in data.toolgate.blocked_tenants
	msg := sprintf("tenant %s is blocked", [input.tenant])
}

deny := approval | refusal

approval_only if {
	count(approval) > 0
	count(refusal) == 0
}

default approval_only := false
