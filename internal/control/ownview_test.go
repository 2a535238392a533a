package control

import (
	"testing"

	"github.com/nats-io/nats.go/micro"
)

// infoRequest is a request with a Nats-Request-Info header.
type infoRequest struct {
	fakeRequest
	info string
}

func (r *infoRequest) Headers() micro.Headers {
	if r.info == "" {
		return micro.Headers{}
	}
	return micro.Headers{"Nats-Request-Info": []string{r.info}}
}

// TestAgentViewer: the caller a tenant endpoint answers is read from the
// server's Nats-Request-Info: an agent sees its own agent's calls, a
// tenant reader and toolgate's own account every call, and a caller from
// another account that does not read as an agent none.
func TestAgentViewer(t *testing.T) {
	for _, c := range []struct {
		name, info string
		sees       map[string]bool
	}{
		{"agent", `{"acc":"TENANT_demo","user":"agent:demo:tok-1:did=3Aagent=3Aa"}`,
			map[string]bool{"did:agent:a": true, "did:agent:b": false, "": false}},
		{"tenant reader", `{"acc":"TENANT_demo","user":"agent:demo:tok-2:did=3Aagent=3Ar:tenant_reader"}`,
			map[string]bool{"did:agent:a": true, "did:agent:b": true, "": true}},
		{"operator", `{"acc":"TOOLGATE","user":"operator:alice"}`, map[string]bool{"did:agent:a": true, "": true}},
		{"no header (a bus without accounts)", "", map[string]bool{"did:agent:a": true}},
		{"an agent name without its agent", `{"acc":"TENANT_demo","user":"agent:demo:tok-1"}`,
			map[string]bool{"did:agent:a": false, "": false}},
		{"a forged reader mark", `{"acc":"TENANT_demo","user":"agent:demo:tok-1:a:admin"}`, map[string]bool{"a": false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := viewerOf(&infoRequest{info: c.info})
			for agent, want := range c.sees {
				if got := v.sees(agent); got != want {
					t.Errorf("sees(%q) = %v, want %v", agent, got, want)
				}
			}
		})
	}
	if got := auditAgent([]byte(`{"type":"ai.agent.tool.succeeded","data":{"agent_did":"did:agent:a"}}`)); got != "did:agent:a" {
		t.Errorf("auditAgent = %q", got)
	}
}
