package control

import (
	"encoding/json"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/token"
)

// tokenKeys answers the public key set capability tokens are verified
// with, read from the verifier on every request so that a rotated key set
// (the --jwks file reloaded) is what the next request gets. Public keys
// only: a KeySet holds nothing else. Any body is accepted: the answer
// names no tenant and no caller.
func (h *handlers) tokenKeys(req micro.Request) {
	var ks *token.KeySet
	if v := h.disc.Tokens; v != nil && v.Keys != nil {
		ks = v.Keys.KeySet()
	}
	if ks == nil {
		respondError(req, api.NewError(api.StateConflict, api.ENoKeySet,
			"this deployment verifies capability tokens with no key set it can publish (start it with --jwks)"))
		return
	}
	b, err := ks.JWKS()
	if err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(json.RawMessage(b))
}
