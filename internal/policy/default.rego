# toolgate's shipped authorization policy.
#
# The authorize stage has already verified the capability token's signature,
# expiry and revocation, and that it names this tenant, agent, tool and
# version. It then evaluates data.toolgate.authz.decision with this input:
#
#   input.request    the ToolInvokeRequest (without its capability token,
#                    and without its parameters unless a rule reads them)
#   input.tool       the manifest of the tool version being called
#   input.claims     the verified token claims (grants, budget, exclusions)
#   input.usage      this token's usage so far (a root token's counts its
#                    whole tree): calls, runtime_ms, cost, tokens,
#                    consecutive_failures; the stage itself also charges
#                    the tree's budget (claims.root_budget) atomically
#   input.resources  what the call needs: paths [{path, mode}], hosts
#                    [{host, port}], credentials [name]
#   input.derived    facts computed in Go: pre_approved (the token
#                    pre-approves this tool), host_granted per host
#   input.approval   the human decision, if one was asked for: {state, decided_by}
#   input.tenant     the tenant of the subject
#   input.time       the evaluation time, RFC 3339
#
# and expects {"allow": bool, "reasons": [string], "requires_approval": bool,
# "code": "E32xx", "approvers": n}. allow with requires_approval means
# "allowed once a human approves" (approvers: how many different people,
# 2 to 5, when more than one); code picks the error code of a denial. Anything else, including
# an undefined decision, is a denial. Push your own with
# `toolgate policy push DIR`.
package toolgate.authz

default decision := {"allow": false, "reasons": ["no rule allowed the call"], "requires_approval": false}

# The first that holds: a refusal, else a call to approve, else an
# allowed call (one chain: each set is counted once, each body tried once).
decision := {
	"allow": false,
	"reasons": sort([d.msg | some d in deny]),
	"requires_approval": false,
	"code": min({d.code | some d in deny}),
} if {
	count(deny) > 0
} else := {"allow": true, "reasons": sort(approval), "requires_approval": true, "approvers": approvers} if {
	count(approval) > 0
} else := {"allow": true, "reasons": [], "requires_approval": false}

approved if input.approval.state == "approved"

risk := lower(object.get(input.tool.safety, "risk_level", "low"))

# How many different people approve a call of this risk level: the
# policy's data (data.json pushed with it) may say, e.g.
# {"approvals": {"approvers_by_risk": {"critical": 2}}}; one otherwise.
# A tool's own safety.approvers asks for more still.
default approvers := 1

approvers := n if n := data.approvals.approvers_by_risk[risk]

# --- Human approval --------------------------------------------------------

approval contains msg if {
	not approved
	risk == "high"
	not input.derived.pre_approved
	msg := sprintf("tool %s is high risk and the token does not pre-approve it", [input.tool.id])
}

approval contains msg if {
	not approved
	risk == "critical"
	msg := sprintf("tool %s is critical risk: every call needs a human's approval", [input.tool.id])
}

approval contains msg if {
	not approved
	input.tool.safety.requires_approval
	msg := sprintf("tool %s requires human approval", [input.tool.id])
}

approval contains "the request asks for human approval" if {
	not approved
	input.request.execution_options.require_approval
}

approval contains msg if {
	not approved
	n := input.claims.budget.approval_after_failures
	n > 0
	input.usage.consecutive_failures >= n
	msg := sprintf("%d calls in a row failed in this session", [input.usage.consecutive_failures])
}

# --- Refusals --------------------------------------------------------------

# Side effects the token excludes; a tag excludes its sub-tags too.
deny contains {"code": "E3209", "msg": msg} if {
	some effect in input.tool.safety.side_effects
	some excluded in input.claims.excluded_side_effects
	excludes(excluded, effect)
	msg := sprintf("the token excludes side effect %s, which tool %s has", [excluded, input.tool.id])
}

excludes(tag, effect) if tag == effect

excludes(tag, effect) if startswith(effect, concat("", [tag, "."]))

# Filesystem: every path the call needs lies within a granted path, and
# writes need a read-write grant.
deny contains {"code": "E3203", "msg": msg} if {
	some need in input.resources.paths
	not path_granted(need.path)
	msg := sprintf("path %s is not granted by the token", [need.path])
}

deny contains {"code": "E3203", "msg": msg} if {
	some need in input.resources.paths
	need.mode == "rw"
	object.get(input.claims, ["filesystem_permissions", "mode"], "ro") != "rw"
	msg := sprintf("path %s needs write access; the token grants read only", [need.path])
}

path_granted(p) if {
	some root in input.claims.filesystem_permissions.allowed_paths
	within(p, root)
}

within(_, "/")

within(p, root) if p == root

within(p, root) if startswith(p, concat("", [root, "/"]))

# Network: hosts matched in Go (wildcards); ports here.
deny contains {"code": "E3204", "msg": msg} if {
	some need in input.resources.hosts
	not input.derived.host_granted[need.host]
	msg := sprintf("host %s is not granted by the token", [need.host])
}

deny contains {"code": "E3204", "msg": msg} if {
	some need in input.resources.hosts
	need.port > 0
	ports := object.get(input.claims, ["network_permissions", "allowed_ports"], [])
	count(ports) > 0
	not need.port in ports
	msg := sprintf("port %d of %s is not granted by the token", [need.port, need.host])
}

deny contains {"code": "E3205", "msg": msg} if {
	some name in input.resources.credentials
	not name in object.get(input.claims, ["credential_permissions", "allowed_secrets"], [])
	msg := sprintf("credential %s is not granted by the token", [name])
}

# Token budget (this token's usage, a root's counting its tree): refused once a limit is reached.
deny contains {"code": "E3211", "msg": msg} if {
	max := input.claims.budget.max_calls
	max > 0
	input.usage.calls >= max
	msg := sprintf("the session has made %d of its %d calls", [input.usage.calls, max])
}

deny contains {"code": "E3211", "msg": msg} if {
	max := input.claims.budget.max_runtime_ms
	max > 0
	input.usage.runtime_ms >= max
	msg := sprintf("the session has used %d of its %d ms of runtime", [input.usage.runtime_ms, max])
}

deny contains {"code": "E3211", "msg": msg} if {
	max := input.claims.budget.max_cost
	max > 0
	input.usage.cost + object.get(input.tool, ["cost", "per_call"], 0) > max
	msg := sprintf("the call would take the session's cost over %v", [max])
}

deny contains {"code": "E3211", "msg": msg} if {
	max := input.claims.budget.max_tokens
	max > 0
	input.usage.tokens >= max
	msg := sprintf("the session has used %d of its %d tokens", [input.usage.tokens, max])
}

# Tenant isolation: an agent acts only for its own tenant.
deny contains {"code": "E3209", "msg": msg} if {
	input.request.agent_context.tenant_id != input.tenant
	msg := sprintf("agent of tenant %s may not act for tenant %s", [input.request.agent_context.tenant_id, input.tenant])
}

# Operators may restrict tool kinds with data.toolgate.allowed_kinds.
deny contains {"code": "E3209", "msg": msg} if {
	allowed := data.toolgate.allowed_kinds
	not input.tool.kind in allowed
	msg := sprintf("tools of kind %s are not allowed here", [input.tool.kind])
}

# Operators may block tenants with data.toolgate.blocked_tenants.
deny contains {"code": "E3209", "msg": msg} if {
	input.tenant in data.toolgate.blocked_tenants
	msg := sprintf("tenant %s is blocked", [input.tenant])
}
