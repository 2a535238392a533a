package client

import (
	"context"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// Checkpoints lists tenant's checkpoints, of one invocation when inv is
// set, oldest first (docs/checkpoints.md).
func (c *Agent) Checkpoints(ctx context.Context, tenant, inv string) ([]api.Checkpoint, error) {
	var out []api.Checkpoint
	if err := checkTenant(tenant); err != nil {
		return nil, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCheckpointsList), api.CheckpointsRequest{TenantID: tenant, InvocationID: inv}, &out)
	return out, err
}

// Checkpoint describes one checkpoint of tenant, with its state when
// withState is set.
func (c *Agent) Checkpoint(ctx context.Context, tenant, id string, withState bool) (api.CheckpointState, error) {
	var out api.CheckpointState
	if err := checkTenant(tenant); err != nil {
		return out, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCheckpointsGet),
		api.CheckpointsRequest{TenantID: tenant, CheckpointID: id, WithState: withState}, &out)
	return out, err
}

// DeleteCheckpoint deletes one checkpoint of tenant and returns what it
// described.
func (c *Agent) DeleteCheckpoint(ctx context.Context, tenant, id string) (api.Checkpoint, error) {
	var out api.Checkpoint
	if err := checkTenant(tenant); err != nil {
		return out, err
	}
	err := c.request(ctx, subjects.TenantSvc(tenant, subjects.SvcCheckpointsDelete), api.CheckpointsRequest{TenantID: tenant, CheckpointID: id}, &out)
	return out, err
}
