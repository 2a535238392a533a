package modeltool

import (
	"net/http"

	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Registration declares the model kind. Its settings are a Config among the
// Deps' settings (catalogue, statistics); requests go through the http
// kind's transport when that kind is built first, so that both confine
// hosts and pool connections in one way.
var Registration = kind.Kind{
	Name: "model",
	New: func(d *kind.Deps) (kind.Runner, error) {
		cfg, _ := kind.Setting[Config](d)
		cfg.Secrets, cfg.Breakers = d.Secrets, d.Breakers
		if t, ok := d.Runner("http").(interface{ Transport() http.RoundTripper }); ok {
			cfg.Transport = t.Transport()
		}
		return New(cfg), nil
	},
}
