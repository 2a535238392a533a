package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// The re-drive methods call the control service's re-drive endpoints
// (docs/redrive.md), signed with c.Sign like the administrative ones.

// RedriveList lists the dead letters r selects, oldest first.
func (c *Client) RedriveList(ctx context.Context, r api.RedriveListRequest) (api.RedriveListResponse, error) {
	var out api.RedriveListResponse
	err := c.admin(ctx, subjects.SvcRedriveList, r, &out)
	return out, err
}

// RedriveShow returns one dead letter, its parameters redacted.
func (c *Client) RedriveShow(ctx context.Context, tenant, id string) (api.RedriveShowResponse, error) {
	var out api.RedriveShowResponse
	err := c.admin(ctx, subjects.SvcRedriveShow, api.RedriveShowRequest{Tenant: tenant, InvocationID: id}, &out)
	return out, err
}

// RedriveRun re-drives the dead letters r names or selects. With token (the
// caller's, still valid) each runs on it; with r.Decision and no token,
// each runs as the original's verified claims on the signing operator's
// word, r.Reason recorded. The token travels in a header, outside the
// signed body every re-drive carries as its proof.
func (c *Client) RedriveRun(ctx context.Context, r api.RedriveRunRequest, token string) (api.RedriveRunResponse, error) {
	if r.At.IsZero() {
		r.At = time.Now().UTC()
	}
	if token != "" {
		sum := sha256.Sum256([]byte(token))
		r.TokenSHA256 = hex.EncodeToString(sum[:])
	}
	sign := func(subject string, body []byte) (nats.Header, error) {
		h := nats.Header{}
		if c.Sign != nil {
			var err error
			if h, err = c.Sign(subject, body); err != nil {
				return nil, err
			}
		}
		if token != "" {
			h.Set(api.RedriveTokenHeader, token)
		}
		return h, nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
	}
	var out api.RedriveRunResponse
	err := c.requestSigned(ctx, subjects.SvcRedriveRun, r, &out, sign)
	return out, err
}
