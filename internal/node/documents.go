package node

import (
	"context"
	"fmt"

	"github.com/toolgate/toolgate/internal/documents"
	"github.com/toolgate/toolgate/internal/policy"
	"github.com/toolgate/toolgate/internal/signedstate"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/stages/execute/mcptool"
)

// newDocuments starts execute's document bridge: it follows the declared
// sources (honouring only operators' signed ones on an authenticated bus)
// and the pushed policy bundle's document rules, and drops cached
// documents as their changes are announced.
func (n *Node) newDocuments(ctx context.Context, c StageConfig, mc mcptool.Config) (*documents.Bridge, error) {
	b, err := documents.New(documents.Config{Store: n.Store, Sandbox: mc.Sandbox, SandboxErr: mc.SandboxErr,
		StartTimeout: mc.StartTimeout, Log: n.Log})
	if err != nil {
		return nil, err
	}
	n.onStop(b.Close)
	var sources, policies signedstate.Order
	err = n.Store.WatchDocSources(ctx, func(name string, rec *kvstore.DocSourceRecord) {
		if rec == nil {
			sources.Removed(name)
			b.Apply(name, nil)
			return
		}
		if c.StateProof != nil {
			err := signedstate.DocSource(*rec, name, c.StateProof)
			if err == nil {
				err = sources.Admit(name, rec.Proof)
			}
			if err != nil {
				n.refusedState(ctx, "urn:toolgate:execute", "document source", rec.Revision, fmt.Errorf("document source %s: %w", name, err))
				return
			}
		}
		src, err := documents.Decode(rec.Source)
		if err != nil || src.Name != name {
			n.Log.Error("a stored document source does not decode; ignoring it", "source", name, "err", err)
			return
		}
		b.Apply(name, src)
	})
	if err != nil {
		return nil, fmt.Errorf("watching document sources: %w", err)
	}
	err = n.Store.WatchPolicy(ctx, func(bundle kvstore.PolicyBundle, ok bool, err error) {
		if !ok {
			policies.Removed("policy")
		}
		if ok && err == nil && c.StateProof != nil {
			if err := policies.Policy(bundle, c.StateProof); err != nil {
				return // authorize audits the refusal
			}
		}
		var p *policy.Documents
		switch {
		case !ok:
			p, err = policy.DefaultDocuments(ctx)
		case err == nil:
			p, err = policy.NewDocuments(ctx, bundle.Modules, bundle.Data)
		}
		if err != nil {
			n.Log.Error("the pushed document policy does not load; keeping the current one", "revision", bundle.Revision, "err", err)
			return
		}
		b.SetPolicy(p)
	})
	if err != nil {
		return nil, fmt.Errorf("watching the policy: %w", err)
	}
	stop, err := b.Listen(n.NC)
	if err != nil {
		return nil, fmt.Errorf("subscribing to document updates: %w", err)
	}
	n.onStop(stop)
	return b, nil
}
