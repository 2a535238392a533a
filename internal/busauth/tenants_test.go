package busauth

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
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

// TestInProcessDeclaredTenant: in-process, a tenant the configuration
// declares keeps its configured account; an undeclared one gets a new one
// with the same imports.
func TestInProcessDeclaredTenant(t *testing.T) {
	dir := t.TempDir()
	k, err := WriteCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	ip, err := NewInProcess(CalloutConfig{Keys: k, Verifier: tenantVerifier{}})
	if err != nil {
		t.Fatal(err)
	}
	o, err := EmbeddedOptions(k, ServerSettings{Name: "t", Port: -1, StoreDir: dir, InProcess: ip, Tenants: []string{"acme"}})
	if err != nil {
		t.Fatal(err)
	}
	o.NoLog = true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ip.Bind(s)
	s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	for _, tenant := range []string{"acme", "globex"} {
		nc, err := nats.Connect(s.ClientURL(), nats.Token(tenant+":tok-1"), nats.NoReconnect())
		if err != nil {
			t.Fatalf("%s: %v", tenant, err)
		}
		nc.Close()
		if n := importsFrom(s, TenantAccount(tenant), AccountToolgate); n != len(tenantServices(tenant))+len(tenantStreams(tenant)) {
			t.Errorf("%s: %d imports from TOOLGATE", tenant, n)
		}
	}
}
