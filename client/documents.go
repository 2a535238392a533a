package client

import (
	"context"
	"encoding/json"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// AddDocSource declares (or replaces) a document source from its JSON
// document and returns it as stored.
func (c *Client) AddDocSource(ctx context.Context, doc json.RawMessage, by string) (json.RawMessage, error) {
	var out json.RawMessage
	err := c.admin(ctx, subjects.SvcDocsSourceAdd, api.DocSourceRequest{Source: doc, By: by}, &out)
	return out, err
}

// DocSources lists the declared document sources' documents.
func (c *Client) DocSources(ctx context.Context) ([]json.RawMessage, error) {
	var out api.DocSourcesResponse
	err := c.admin(ctx, subjects.SvcDocsSourceList, struct{}{}, &out)
	return out.Sources, err
}

// RemoveDocSource removes a document source (E3601 when unknown).
func (c *Client) RemoveDocSource(ctx context.Context, name, by string) error {
	var out api.DocSourceRequest
	return c.admin(ctx, subjects.SvcDocsSourceRemove, api.DocSourceRequest{Name: name, By: by}, &out)
}
