package api

import "strconv"

// Number is the numeric part of an E-code ("E3024" is 3024), or 0 when
// ecode is not one. NATS micro services send it as Nats-Service-Error-Code,
// which the services protocol requires to be a number.
func Number(ecode string) int {
	if len(ecode) < 2 || ecode[0] != 'E' {
		return 0
	}
	n, err := strconv.Atoi(ecode[1:])
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// Numeric E-codes. The registry, executor, permission and result ranges follow
// the tool execution layer specification; E3010-E3025 (request envelope) and
// E3900-E3999 (pipeline) are toolgate's own. docs/errors.md lists them all.
const (
	// Registry.
	EToolNotFound    = "E3001"
	EVersionNotFound = "E3002"
	EToolDeprecated  = "E3003" // a warning, never a failure
	EToolRemoved     = "E3004"
	// A search could not be run: its query is over the limits, or its
	// cursor belongs to another search.
	ESearchFailed       = "E3005"
	EVersionUnsatisfied = "E3006"
	EDuplicateTool      = "E3007"
	EInvalidManifest    = "E3008"
	EMalformedEvent     = "E3010"
	EWrongEventType     = "E3011"
	EInvalidAttribute   = "E3012"
	EPayloadTooLarge    = "E3013"
	ETenantMismatch     = "E3014"
	EParametersInvalid  = "E3015"
	ERequestInvalid     = "E3016"
	// The tenant of the subject or the invocation id cannot name a subject
	// or key: too long, a forbidden character, or a reserved name.
	EInvalidName = "E3019"
	// The invocation id is already taken in the tenant by another request
	// (another ingest sequence).
	EDuplicateInvocation = "E3024"
	EExecutorUnavailable = "E3101"
	EResourceLimit       = "E3102" // a sandbox limit was hit: memory, CPU, file size, processes, output
	ESandboxCrashed      = "E3107" // the sandboxed tool was killed by a signal
	// The agent already has as many calls running as it may.
	EConcurrentLimit = "E3106"
	// A warning, never a failure: the call's CPU share could not be
	// applied on this host.
	ECPUShareNotApplied = "E3110"
	ETimeout            = "E3103"
	EToolFailed         = "E3108"
	EToolPanicked       = "E3109"
	EPolicyFailed       = "E3206"
	EPolicyDenied       = "E3209"
	EResultSchema       = "E3501"
	EResultNotJSON      = "E3502"
	// The result lacks a field its output schema requires, and fails it in
	// no other way.
	EResultMissingField = "E3506"
	// A field of the result has a type its output schema does not allow,
	// and the result fails it in no other way.
	EResultFieldType = "E3507"
	// A manifest asks for strict result validation and declares no
	// output schema (refused at registration).
	EResultSchemaMissing = "E3508"
	EDeliveryExhausted   = "E3901"
	EInternal            = "E3902"
	EPoisonMessage       = "E3903"
	// A re-drive the operator's signed run request does not cover (another
	// tenant, call or operator, or a decision asked for and not signed),
	// or that names a dead letter that is not there (docs/redrive.md).
	ERedriveRefused = "E3904"
)

// Safety verifier codes (input bounds, output findings).
const (
	EParameterBounds  = "E3017" // depth or string length over the limit
	EInputRuleFired   = "E3018" // an injection detector fired on a checked parameter
	EPathOutsideRoots = "E3105" // a path parameter leaves the granted roots
	EOutputSQL        = "E3503"
	EOutputXSS        = "E3504"
	EOutputCommand    = "E3505"
	EOutputSecret     = "E3509"
	EOutputPII        = "E3510"
	EOutputInjection  = "E3511"
	EOutputTooLarge   = "E3512"
	EResultUnsendable = "E3513" // the verified result would not fit in one message of the server
	// EOutputMaliciousCode: code for the agent to run that harms the host
	// (a download piped to a shell, rm -rf /, a reverse shell), where the
	// manifest's action for malicious_code is reject.
	EOutputMaliciousCode = "E3858"
	EOutputTooDeep       = "E3859" // a result nested deeper than verify.MaxResultDepth
	// EToolDescriptionRefused: a tool's description, schema texts or
	// annotations hold instructions or code aimed at the agent
	// (internal/tooldesc); details name each field path and detector.
	EToolDescriptionRefused = "E3865"
	// EToolDescriptionSecret: a manifest registered with a secret in its
	// texts (an import redacts them; a hand-written manifest must).
	EToolDescriptionSecret = "E3866"
	// EToolChangeNone: an accept (register with accept_digest) of a version
	// with no change held.
	EToolChangeNone = "E3867"
	// EToolChangeDigest: an accept naming another digest than the
	// change held: the server changed the tool again since it was shown.
	EToolChangeDigest = "E3868"
	// EToolChangeHeld: a replace of an imported tool whose server now
	// says something else about it; the pinned manifest stays served and
	// the new one waits for an accept (tools accept).
	EToolChangeHeld = "E3869"
)

// Capability token, policy and approval codes. E3201-E3208 follow the
// specification; E3210-E3219 are toolgate's own.
const (
	ETokenInvalid      = "E3201" // bad signature, algorithm, key, issuer, audience or form
	ETokenExpired      = "E3202"
	EFilesystemDenied  = "E3203" // a path the call needs is outside the token's grants
	ENetworkDenied     = "E3204"
	ECredentialDenied  = "E3205"
	ETokenClaims       = "E3207" // a required claim is missing
	ETokenRevoked      = "E3208"
	ENotGranted        = "E3210" // the token is for another tenant, agent, tool or version
	EBudgetExhausted   = "E3211"
	EApprovalDenied    = "E3212"
	EApprovalExpired   = "E3213"
	EApprovalUnknown   = "E3214" // no pending approval with that invocation id
	EApprovalDecided   = "E3215" // the approval was decided already
	EAttenuationWidens = "E3216" // a child token would widen its parent
	EDeciderUnverified = "E3217" // an approval decision not signed by operator credentials
	EHopUnsealed       = "E3218" // execute got a hop without a valid seal of authorize's decision
	EAdminUnverified   = "E3219" // an administrative request not signed by operator credentials
	EApprovalMismatch  = "E3220" // an approval names a request other than the one parked
	// A signed request from a person whose role may not send it: an
	// auditor's decision, an approver's policy push (busauth.MaySign).
	ERoleNotPermitted = "E3245"
	// The console refuses admin and operator credentials unless told to
	// (--allow-admin): it runs with an approver's.
	EConsoleCredentials = "E3247"
	// Two-person rule (a tool's safety.approvers): an approval by a person
	// who approved the call already; the call stays parked.
	EApprovalSamePerson = "E3248"
	// An approved call whose record lacks the verified approvals of as many
	// different people as its tool requires.
	EApprovalsShort = "E3249"
	// The bus refused to carry a request: the connection's credentials may
	// not publish to its subject (details.subject).
	EBusNotPermitted = "E3221"
	// The bus refused the reply subscription: an agent's connection must use
	// the inbox prefix _INBOX.<tenant>.<token id> (details.subject).
	EBusInbox = "E3222"
	// The bus refused the connection: no credentials, or credentials it
	// does not accept.
	EBusRefused = "E3223"
	// The control service was asked for the token key set but verifies
	// tokens with none it can publish (no --jwks, no development key).
	ENoKeySet = "E3226"
	// A stage got a message on its input that no role that may send there
	// signed: sent with stolen credentials but without the role's key, or
	// altered on the way. It is recorded as poison and dropped.
	EMessageUnsigned = "E3224"
	// A record another role stored for this one to trust (a hook's
	// decision) does not carry its maker's signature.
	ERecordUnsigned = "E3225"
	// A status record's cancel flag without the control service's
	// signature for that invocation: ignored, and audited.
	ECancelUnsigned = "E3235"
	// A cancel flag an agent other than the call's set before any stage
	// recorded the call (so the control service could not tell whose it
	// was): ignored, and audited.
	ECancelNotOwn = "E3250"
	// A checkpoint whose description execute did not sign, or that is
	// bound to another invocation, tenant or sequence than the key it is
	// stored under: not resumed from.
	ECheckpointUnsigned = "E3236"
	// A rate-limit counter found deleted: counted as empty, never as
	// refilled.
	ECounterErased = "E3237"
	// Audit refused an ending handed to it by a role that may not end
	// that call: not the stage the ending names, not an ending that role
	// makes, or from a stage after authorize (or control) without its own
	// custody, which the stage that handed it the call made. It is recorded as
	// poison and dropped; the invocation it names is not touched.
	EEndingRefused = "E3230"
	// Audit refused a relayed event whose CloudEvent type, source or
	// tenant is not one its signer's role emits on that subject. It is
	// recorded as poison and never published.
	ERelayRefused = "E3231"
	// The shadow candidate in the bucket carries no operator's signature
	// over exactly what it holds (written there with the control role's
	// bucket right): not shown as the operator's, never promoted.
	EShadowUnsigned = "E3240"
	// A promote names a candidate (candidate_digest, as show gave it) other
	// than the one stored now: the candidate changed since it was shown.
	EShadowChanged = "E3241"
	// A re-drive names a dead letter (digests, as redrive show gave them)
	// other than the one stored now: it changed since it was shown.
	EDeadLetterChanged = "E3242"
	// A dead letter not signed by the audit stage: published with audit's
	// credential but not its key, or altered; it is never re-driven.
	EDeadLetterUnsigned = "E3243"
	// The call asked about (its status, approval, checkpoint) is another
	// agent's: an agent sees only its own calls unless its token is a
	// tenant reader's (docs/security.md).
	ENotOwnCall = "E3260"
)

// Site codes (docs/sites.md).
const (
	// A manifest names a site the deployment has not declared
	// (toolgate site add).
	EUnknownSite = "E3270"
	// A call waited at the hub for its site, whose link was down or whose
	// worker was busy, until its deadline passed.
	ESiteTimeout = "E3271"
	// A hand-off to verify from a site's worker for a call route did not
	// send to that site, or from the hub's execute for a site's call.
	ESiteHandOffRefused = "E3272"
	// A call for a site's tool reached route after the site was removed
	// (toolgate site remove): it has nowhere to run.
	ESiteRemoved = "E3273"
	// toolgate site remove names a site the deployment does not declare.
	ESiteNotDeclared = "E3274"
	// A site request reached a control service that cannot declare sites:
	// one not running in the hub's process (its data directory).
	ESitesUnavailable = "E3275"
	// A site's outbox was full: what it sends is refused until the hub has
	// forwarded what it holds (a flood; audited at most once a minute).
	ESiteFlood = "E3276"
	// The hub's forwarder refused messages a site signed for calls that are
	// not its own to hand on (audited as one summary a minute per site).
	ESiteRefusedSummary = "E3277"
)

// Resilience codes.
const (
	ERateLimited = "E3303" // over the tool's rate limit for the tenant; retryable
	EBreakerOpen = "E3401" // the tool's circuit breaker is open; retryable
	// A manifest's circuit breaker configuration is invalid (a threshold
	// over 100, a window under 1), and nothing else in it is.
	EBreakerConfig = "E3403"
	// The idempotency key was used by a request asking for something else.
	EIdempotencyMismatch = "E3020"
	// The first invocation with this idempotency key has not ended yet.
	EIdempotencyInFlight = "E3021"
	// The invocation was cancelled on request.
	ECancelled = "E3022"
	// A tool that is neither idempotent nor checkpointed was interrupted
	// mid-run; whether it took effect is unknown, so it is not run again.
	EOutcomeUnknown = "E3023"
	// No invocation with that id is known to toolgate (status, cancel).
	EInvocationNotFound = "E3025"
)

// Capability request codes.
const (
	// The capability request is malformed: unknown fields, a wrong kind,
	// an empty or over-long field, or constraints out of range.
	ECapabilityInvalid = "E3040"
	// A capability request with that id exists already in the tenant.
	ECapabilityDuplicate = "E3041"
	// No capability request with that id (capability.report).
	ECapabilityUnknown = "E3042"
	// No registered tool offers the capability within the constraints;
	// details.considered says why each tool naming it was left out.
	ECapabilityNoMatch = "E3043"
	// The operator's policy grants no token for the request
	// (toolgate.capability.grant); details.reasons.
	ECapabilityNotGranted = "E3044"
)

// MCP codes (toolgate's own).
const (
	// The MCP server is not running: it failed to start or is restarting
	// after a crash. Retryable; nothing reached the tool.
	EMCPServerDown = "E3120"
	// The MCP server exited while the call was in flight.
	EMCPServerExited = "E3121"
	// The MCP server refused the call (unknown tool, bad arguments) or
	// answered outside the protocol.
	EMCPProtocol = "E3122"
)

// HTTP tool codes. E3104 and E3302-E3308 follow the specification.
const (
	// The tool tried to reach a host or port outside its allowlist (the
	// manifest's permissions.network within the token's grants), directly
	// or through a redirect. Raised by the executor, after authorize.
	ENetworkPolicy = "E3104"
	// The secrets directory cannot be opened and the environment does not
	// hold the secret: the source is unreachable, not known to lack it.
	ESecretSourceUnreachable = "E3301"
	// The secret a tool's credential names is in no configured source.
	ECredentialUnavailable = "E3302"
	// The external service answered with an error status: 5xx (retryable)
	// or a 4xx other than 401, 403 and 429.
	EExternalStatus = "E3304"
	// The external service could not be reached or broke off the exchange.
	EExternalUnreachable = "E3306"
	// The external service refused the credentials (401 or 403).
	EExternalAuth = "E3307"
	// The external service's response is not in the declared format.
	EExternalMalformed = "E3308"
)

// Start-up refusals (toolgate's own): a process that would be unsafe does
// not start.
const (
	// The file root contains, or lies inside, toolgate's own state (data
	// directory, development key, secrets), which tools would then reach.
	EUnsafeFileRoot = "E3950"
	// A worker's security settings differ from the cluster's recorded ones.
	ESecuritySettings = "E3951"
	// The audit archive could not be written, or an object read back from
	// it differs from what was written (audit.archive.failed; retried).
	EAuditArchiveFailed = "E3970"
	// The audit archive's head names a range no object holds: its last
	// objects were removed, or the archive rolled back to an earlier run.
	EAuditArchiveTruncated = "E3968"
)

// Receipts (toolgate's own): checking a receipt audit signed, offline or
// from the control service (docs/audit.md).
const (
	// The receipt's signature does not verify with the key given: a byte
	// of it changed, or another key signed it.
	EReceiptForged = "E3960"
	// The result given is not the one the receipt's hash names.
	EReceiptResult = "E3961"
	// The inclusion proof does not prove the receipt: it is another
	// event's, its tree's root or signature does not check, or its event
	// carries another receipt.
	EReceiptProof = "E3962"
	// The file is not a receipt (nor a receipt with its proof).
	EReceiptMalformed = "E3963"
	// No receipt for the invocation: unknown, not ended, or ended before
	// audit signed receipts.
	EReceiptNotFound = "E3964"
	// The proof's checkpoint (head) does not verify with the key: a byte
	// of it changed, or another key signed it.
	EReceiptHeadForged = "E3965"
	// The proof's event and audit path do not lead to its checkpoint's
	// root: a proof for another tree.
	EReceiptTree = "E3966"
	// The checkpoint's listing (ids, tenants, leaves) is not the one its
	// signed hash names.
	EReceiptListing = "E3967"
	// The result message is not the one its receipt names (ending_sha256):
	// a byte of the message changed, the receipt is another call's, or it
	// carries none.
	EReceiptEnding = "E3905"
)

// Model kind codes (toolgate's own, outside the specification's E3000-E3799).
const (
	// The request names a model, or a manifest allows one, that the model
	// catalogue does not hold.
	EModelUnknown = "E3850"
	// No model in the catalogue meets the request's constraints (tier,
	// cost, latency, capabilities); details.considered says why each was
	// left out.
	EModelNoCandidate = "E3851"
	// The request does not fit the context window of any model it may use,
	// and it does not allow truncation.
	EModelContextWindow = "E3852"
	// A provider's answer is not in its API's wire format.
	EModelMalformed = "E3853"
	// A provider's answer exceeds the tool's response bound.
	EModelAnswerTooLarge = "E3854"
	// A streamed answer stopped before its final event.
	EModelStreamCut = "E3855"
	// Every model in the fallback chain failed; details.attempts lists them.
	EModelChainExhausted = "E3856"
	// A catalogue entry cannot be used (no endpoint, unknown API flavour).
	EModelMisconfigured = "E3857"
)

// Checkpoint codes (the specification's E3701-E3707; docs/checkpoints.md).
const (
	// A checkpoint could not be stored: the bucket refused the write, or
	// the state is not JSON or over the size limit.
	ECheckpointCreate = "E3701"
	// No checkpoint with that id in the tenant (resume, show, delete).
	ECheckpointNotFound = "E3702"
	// A checkpoint's stored data cannot be read back: a chunk or a
	// delta's parent is missing, or the data is corrupt.
	ECheckpointRestore = "E3703"
	// Another run wrote the same checkpoint, or a checkpoint another one
	// is a delta of was to be deleted first.
	ECheckpointConflict = "E3704"
	// A delta could not be applied to its parent's state.
	ECheckpointDelta = "E3705"
	// The state could not be compressed or decompressed.
	ECheckpointCompression = "E3706"
	// The checkpoint's time has passed (a micro checkpoint after an hour,
	// a macro one after the retention): it can no longer be resumed.
	ECheckpointExpired = "E3707"
)

// Hook codes (toolgate's own): declarative hooks that decide what follows
// a denied, failed, timed-out or overspent call (docs/hooks.md).
const (
	// A hook does not compile: an unknown trigger or action, a condition
	// that is not a boolean CEL expression (its line and column in the
	// field error), a template naming an unknown variable. Refused at
	// registration (a manifest) or push (a tenant's hook set).
	EHookInvalid = "E3800"
	// A hook would start another linked invocation past the chain's depth
	// limit; the call ends with this code and its own error in
	// details.cause.
	EHookLimit = "E3801"
	// The call belongs to a session (token tree) an abort hook ended.
	ESessionAborted = "E3802"
	// A skip hook ended the call before it took effect; details.cause is
	// the error it replaced.
	EHookSkipped = "E3803"
	// A request names a parent invocation (link) that no hook handed it:
	// the link, tool, version, parameters or agent differ from what the
	// hook decided, or the request carries a token of its own.
	ELinkRefused = "E3804"
)

// Document codes: the document bridge (docs/documents.md). E3601-E3608 are
// the specification's; E3609 is toolgate's.
const (
	// A document of document_context does not exist at its source (or the
	// request names a source nobody declared).
	EDocNotFound = "E3601"
	// The source is down, retries are spent and the cache holds no copy.
	EDocUnavailable = "E3602"
	// The document policy denies the agent this document.
	EDocDenied = "E3603"
	// A requested or pinned version is no longer served by the source.
	EDocVersionConflict = "E3604"
	// The source did not answer within its request timeout.
	EDocTimeout = "E3605"
	// The source answered with something that is not a document.
	EDocProtocol = "E3606"
	// The document cache is unreachable; the document was fetched from the
	// source (a warning in execution_metadata, not a failure).
	EDocCacheUnavailable = "E3607"
	// The pinned versions could not be stored with the invocation.
	EDocPinFailed = "E3608"
	// The documents handed to a call exceed its size limit.
	EDocTooLarge = "E3609"
)
