package subjects

// Shadow policy endpoints, operators only (signed like AdminServices):
// SvcPolicyShadowPush takes api.PolicyPushRequest (the candidate),
// SvcPolicyShadowGet answers api.PolicyBundle, SvcPolicyShadowDrop takes
// {}, SvcPolicyShadowPromote takes api.PolicyPushRequest (the candidate's
// modules and data, which it makes the live policy) and
// SvcPolicyShadowReport takes api.ShadowReportRequest.
const (
	SvcPolicyShadowPush    = "tool.svc.policy.shadow.push"
	SvcPolicyShadowGet     = "tool.svc.policy.shadow.get"
	SvcPolicyShadowDrop    = "tool.svc.policy.shadow.drop"
	SvcPolicyShadowPromote = "tool.svc.policy.shadow.promote"
	SvcPolicyShadowReport  = "tool.svc.policy.shadow.report"
)

// ShadowDivergedAll matches every tenant's policy.shadow.diverged events.
var ShadowDivergedAll = AuditEvent("*", "policy.shadow.diverged")

// DecisionRecordedAll matches every tenant's policy.decision.recorded events.
var DecisionRecordedAll = AuditEvent("*", "policy.decision.recorded")
