package busauth

import (
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/subjects"
)

func TestParseTenants(t *testing.T) {
	got, err := ParseTenants([]byte("# tenants\nglobex\n\n  acme  # the first\nacme\n"))
	if err != nil || !slices.Equal(got, []string{"acme", "globex"}) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, bad := range []string{"a.b\n", "_system\n", "a b\n", "tenant*\n", "x>\n"} {
		if _, err := ParseTenants([]byte(bad)); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// FuzzParseTenants: whatever the tenants file holds, what is accepted are
// tenant names, and the configuration rendered from them loads.
func FuzzParseTenants(f *testing.F) {
	f.Add([]byte("acme\nglobex # two\n"))
	f.Add([]byte("a.b\n"))
	f.Add([]byte("\"x\": {}\n"))
	k, err := GenerateKeys()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tenants, err := ParseTenants(b)
		if err != nil {
			return
		}
		for _, tn := range tenants {
			if subjects.CheckTenant(tn) != nil || strings.ContainsAny(tn, "{}:\"'#") {
				t.Fatalf("accepted %q", tn)
			}
		}
		var o server.Options
		if err := o.ProcessConfigString(ServerConfig(k.Public(), tenants)); err != nil {
			t.Fatalf("configuration for %q: %v", tenants, err)
		}
	})
}
