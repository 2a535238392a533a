package httptool

import (
	"net/http"
	"net/url"

	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
)

// What other kinds that speak HTTP (the model kind) share with this one, so
// that credentials are scrubbed and hosts confined in one way only.

// Scrubber removes secret values and their common encodings from text
// (String) and from decoded JSON (JSON). A nil Scrubber changes nothing.
type Scrubber = scrubber

// NewScrubber covers each value as sent and as a server may echo it.
func NewScrubber(values ...string) *Scrubber { return newScrubber(values...) }

// CheckHost refuses (network_policy, E3104) a connection of a call of m to
// u unless the manifest's permissions.network (when it lists any) and the
// token's grants g allow its host and port.
func CheckHost(m *tools.Manifest, g envelope.Grants, u *url.URL) error {
	return newAllowlist(m, g).check(u)
}

// Transport is k's pooled transport: no proxy, and host names that resolve
// to non-public addresses refused unless the Config allows them.
func (k *Kind) Transport() http.RoundTripper { return k.transport }
