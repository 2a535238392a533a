package client

import (
	"context"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// AddSite declares a site at the hub with the public halves of its keys
// and returns what its bundle needs of the hub (docs/sites.md).
func (c *Client) AddSite(ctx context.Context, r api.SiteRequest) (api.SiteAdded, error) {
	var out api.SiteAdded
	err := c.admin(ctx, subjects.SvcSitesAdd, r, &out)
	return out, err
}

// RemoveSite removes a site: its credentials are refused and its links cut
// (E3274 when it is not declared).
func (c *Client) RemoveSite(ctx context.Context, site, by string) (api.SiteRemoved, error) {
	var out api.SiteRemoved
	err := c.admin(ctx, subjects.SvcSitesRemove, api.SiteRequest{Site: site, By: by}, &out)
	return out, err
}
