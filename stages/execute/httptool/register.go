package httptool

import (
	"encoding/json"

	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Registration declares the http kind. Its Resources tell authorize the
// host a call's URL names, which may come from the parameters (http.get),
// so that the policy refuses it before execute.
var Registration = kind.Kind{
	Name: "http",
	New: func(d *kind.Deps) (kind.Runner, error) {
		k := New(Config{Secrets: d.Secrets, AllowPrivateNetworks: d.AllowPrivateNetworks})
		d.Release(k.Close)
		return k, nil
	},
	Resources: resources,
}

// resources is the endpoint Target finds; none when the URL cannot be
// built (the executor then refuses the call itself).
func resources(m *tools.Manifest, params json.RawMessage) (kind.Resources, error) {
	host, port, ok := Target(m, params)
	if !ok {
		return kind.Resources{}, nil
	}
	return kind.Resources{Hosts: []kind.Host{{Host: host, Port: port}}}, nil
}
