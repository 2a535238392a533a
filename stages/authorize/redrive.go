package authorize

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// redriven returns the principal of a re-drive of a dead-lettered call
// (docs/redrive.md). The operator's signed redrive.run request must cover
// it: this tenant, this original (named, or under a filter of this
// tenant), this operator, and the same choice of authority. With the
// caller's token the call is judged on that token like any other; on the
// operator's decision it runs as the original's principal, which authorize
// itself signed or sealed, expired or not, but never past a revocation (Process
// checks that next). Policy, approval and budget then judge it as usual.
func (a *Authorizer) redriven(_ context.Context, inv *envelope.Invocation, rawToken string) (*token.Claims, error) {
	rd := inv.Request.Redrive
	refuse := func(format string, args ...any) error {
		return api.NewError(api.PermissionDenied, api.ERedriveRefused, "re-drive of %s refused: "+format,
			append([]any{rd.Original}, args...)...)
	}
	if rd.Depth < 1 || inv.ID != subjects.RedriveID(rd.Root, rd.Depth) {
		return nil, refuse("the invocation id is not the re-drive's (%s)", subjects.RedriveID(rd.Root, max(rd.Depth, 1)))
	}
	if a.cfg.RedriveProof != nil {
		if err := a.coveredByRun(inv, rd); err != nil {
			return nil, refuse("%v", err)
		}
	}
	if !rd.Decision {
		if rawToken == "" {
			return nil, refuse("it carries no capability token and no operator's decision")
		}
		return a.cfg.Verifier.Verify(rawToken)
	}
	if rawToken != "" {
		return nil, refuse("a re-drive on the operator's decision carries no token")
	}
	p := rd.Principal
	if p == nil || len(p.Claims) == 0 {
		return nil, refuse("the original had no verified capability token")
	}
	if a.cfg.PrincipalSigned != nil {
		orig := &envelope.Invocation{Tenant: inv.Tenant, ID: rd.Original,
			Principal: &envelope.Principal{Session: p.Session, Claims: p.Claims}}
		if !a.principalVouched(orig, p) {
			return nil, api.NewError(api.PermissionDenied, api.ERecordUnsigned,
				"re-drive of %s refused: the original's principal is not signed by authorize", rd.Original)
		}
	}
	claims := new(token.Claims)
	if err := json.Unmarshal(p.Claims, claims); err != nil {
		return nil, refuse("undecodable claims: %v", err)
	}
	return claims, nil
}

// principalVouched reports whether authorize signed orig's principal p, or
// sealed the call with it.
func (a *Authorizer) principalVouched(orig *envelope.Invocation, p *api.DeadLetterPrincipal) bool {
	if len(p.Seal) > 0 && a.cfg.PrincipalSealed != nil {
		var sl envelope.Seal
		if json.Unmarshal(p.Seal, &sl) == nil && a.cfg.PrincipalSealed(orig, &sl) {
			return true
		}
	}
	return a.cfg.PrincipalSigned(envelope.PrincipalText(orig), p.Sig)
}

// coveredByRun checks the operator's signed run request behind rd.
func (a *Authorizer) coveredByRun(inv *envelope.Invocation, rd *api.Redrive) error {
	if rd.Proof == nil {
		return errString("no operator's signed run request")
	}
	who, err := a.cfg.RedriveProof(rd.Proof)
	if err != nil {
		return err
	}
	var run api.RedriveRunRequest
	if rd.Proof.Subject != subjects.SvcRedriveRun || json.Unmarshal(rd.Proof.Body, &run) != nil {
		return errString("the signed request is not a redrive.run")
	}
	switch {
	case who != rd.By:
		return errString("the run was signed by " + who + ", not " + rd.By)
	case run.Tenant != inv.Tenant:
		return errString("the run is for tenant " + run.Tenant)
	case run.Decision != rd.Decision:
		return errString("the run asked for another authority")
	case !slices.Contains(run.IDs, rd.Original) && (run.Filter == nil || len(run.IDs) > 0):
		return errString("the run does not name it")
	}
	return nil
}

type errString string

func (e errString) Error() string { return string(e) }
