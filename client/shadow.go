package client

import (
	"context"
	"errors"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// The shadow policy methods call the control service's shadow endpoints
// (docs/authorization.md), signed with c.Sign.

// PushShadowPolicy makes modules and data the candidate policy authorize
// evaluates beside the live one without enforcing it.
func (c *Client) PushShadowPolicy(ctx context.Context, modules map[string]string, data map[string]any, by string) (api.PolicyPushResponse, error) {
	var out api.PolicyPushResponse
	err := c.admin(ctx, subjects.SvcPolicyShadowPush, api.PolicyPushRequest{Modules: modules, Data: data, By: by}, &out)
	return out, err
}

// ShadowPolicy returns the candidate (Pushed false when there is none).
func (c *Client) ShadowPolicy(ctx context.Context) (api.PolicyBundle, error) {
	var out api.PolicyBundle
	err := c.admin(ctx, subjects.SvcPolicyShadowGet, struct{}{}, &out)
	return out, err
}

// DropShadowPolicy removes the candidate.
func (c *Client) DropShadowPolicy(ctx context.Context, by string) error {
	var out struct{}
	return c.admin(ctx, subjects.SvcPolicyShadowDrop, map[string]string{"by": by}, &out)
}

// PromoteShadowPolicy makes the candidate in force the live policy: it
// reads the candidate and signs a request naming exactly its modules,
// data and digest, which the live bundle then carries as its proof.
func (c *Client) PromoteShadowPolicy(ctx context.Context, by string) (api.PolicyPushResponse, error) {
	return c.PromoteShownShadowPolicy(ctx, "", by)
}

// PromoteShownShadowPolicy is PromoteShadowPolicy for the candidate whose
// digest (api.PolicyBundle.Digest, as ShadowPolicy gave it) is digest: the
// control service promotes exactly that candidate or nothing (E3241 when
// the one stored now differs). An empty digest names the candidate read
// now.
func (c *Client) PromoteShownShadowPolicy(ctx context.Context, digest, by string) (api.PolicyPushResponse, error) {
	var out api.PolicyPushResponse
	cand, err := c.ShadowPolicy(ctx)
	if err != nil {
		return out, err
	}
	if !cand.Pushed {
		return out, errors.New("there is no candidate policy to promote")
	}
	if digest == "" {
		digest = cand.Digest
	}
	err = c.admin(ctx, subjects.SvcPolicyShadowPromote, api.PolicyPushRequest{Modules: cand.Modules, Data: cand.Data, By: by,
		CandidateDigest: digest}, &out)
	return out, err
}

// ShadowReport sums up where the candidate disagreed with the live policy.
func (c *Client) ShadowReport(ctx context.Context, r api.ShadowReportRequest) (api.ShadowReport, error) {
	var out api.ShadowReport
	err := c.admin(ctx, subjects.SvcPolicyShadowReport, r, &out)
	return out, err
}
