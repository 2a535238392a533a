package control

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
)

// viewer is who asks on a tenant-scoped endpoint and whose calls it may
// see: an agent sees its own agent's calls (the agent_did of its token,
// api.Record.Agent), a tenant reader (the token's tenant_reader claim),
// operators and toolgate's own processes every call of the tenant.
type viewer struct {
	// who is the caller the server names, for the audit of a refusal.
	who string
	// agent is the agent whose calls the caller sees when not all.
	agent string
	all   bool
}

// everyone is the viewer of operators' un-scoped endpoints.
var everyone = viewer{all: true}

// sees reports whether the caller may see a call made by agent. A call
// whose agent is not known is only for those who see all.
func (v viewer) sees(agent string) bool {
	return v.all || (v.agent != "" && agent == v.agent)
}

// viewerOf reads the caller of a tenant-scoped request from the
// Nats-Request-Info header the server stamps on requests from another
// account. A request from toolgate's own account, or on a bus without
// accounts (no header), sees all; one from a tenant's account is an
// agent's, whose user name (busauth.Identity.UserName) carries its agent
// and whether it is a tenant reader. A caller from another account that
// does not read as an agent sees nothing.
func viewerOf(req micro.Request) viewer {
	var info struct {
		Account string `json:"acc"`
		User    string `json:"user"`
	}
	h := req.Headers().Get("Nats-Request-Info")
	if h == "" {
		return everyone
	}
	if json.Unmarshal([]byte(h), &info) != nil {
		return viewer{}
	}
	if info.Account == "" || info.Account == ownAccount {
		return everyone
	}
	id, err := busauth.ParseUserName(info.User)
	if err != nil || id.Role != busauth.RoleAgent {
		return viewer{who: info.User}
	}
	if id.TenantReader {
		return viewer{who: info.User, agent: id.Name, all: true}
	}
	return viewer{who: info.User, agent: id.Name}
}

// notOwn refuses v a call of another agent (E3260) and audits the
// refusal. The answer says no more than that the call is not the
// caller's.
func (h *handlers) notOwn(v viewer, endpoint, tenant, invocation, checkpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	details := map[string]any{"tenant_id": tenant, "invocation_id": invocation}
	if checkpoint != "" {
		details["checkpoint_id"] = checkpoint
	}
	// A refusal the trail misses is still a refusal: the answer stands.
	_ = h.auditAdmin(ctx, api.TypeViewRefused, api.AdminChange{Action: endpoint, By: v.who, Target: tenant, Details: details})
	what := "invocation " + invocation
	if checkpoint != "" {
		what = "checkpoint " + checkpoint
	}
	return api.NewError(api.PermissionDenied, api.ENotOwnCall,
		"%s is another agent's call: an agent sees only its own calls", what)
}

// ownOnly reports whether the record of invocation id of tenant is one v
// may see; a record that cannot be read is for those who see all.
func (h *handlers) ownOnly(ctx context.Context, v viewer, tenant, id string) bool {
	if v.all {
		return true
	}
	rec, err := h.store.Status(ctx, tenant, id)
	return err == nil && v.sees(rec.Agent)
}

// auditAgent is the agent_did an audit event's data names, or "".
func auditAgent(event json.RawMessage) string {
	var e struct {
		Data struct {
			AgentDID string `json:"agent_did"`
		} `json:"data"`
	}
	_ = json.Unmarshal(event, &e)
	return e.Data.AgentDID
}
