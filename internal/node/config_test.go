package node_test

import (
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestConfigValidate: the combinations Run cannot start with are refused
// before anything starts, each with the error Run gives; the rest pass.
func TestConfigValidate(t *testing.T) {
	const url = "nats://127.0.0.1:4222"
	data := node.EmbeddedOptions{DataDir: "/var/lib/toolgate"}
	for _, tc := range []struct {
		name string
		c    node.Config
		want string // "" accepts
	}{
		{"embedded with a data directory", node.Config{Embedded: data}, ""},
		{"embedded without a data directory", node.Config{}, "embedded NATS needs a data directory"},
		{"external without a data directory", node.Config{NATSURL: url}, ""},
		{"creds for one stage", node.Config{NATSURL: url, Creds: "x.creds", Stages: []string{subjects.Execute}}, ""},
		{"creds for one stage and the callout", node.Config{NATSURL: url, Creds: "x.creds", AuthCallout: true,
			Stages: []string{subjects.Execute, node.AuthCallout}}, ""},
		{"creds for the callout alone", node.Config{NATSURL: url, Creds: "x.creds", AuthCallout: true,
			Stages: []string{node.AuthCallout}}, ""},
		{"creds for two stages", node.Config{NATSURL: url, Creds: "x.creds", Embedded: data,
			Stages: []string{subjects.Validate, subjects.Authorize}}, "--creds names one role's credentials"},
		{"creds for every stage (the default)", node.Config{NATSURL: url, Creds: "x.creds"}, "--creds names one role's credentials"},
		{"creds for no stage without the callout", node.Config{NATSURL: url, Creds: "x.creds",
			Stages: []string{node.AuthCallout}}, "--creds names one role's credentials"},
		{"creds on the embedded server are not used", node.Config{Creds: "x.creds", Embedded: data}, ""},
		{"examples with the data directory's key", node.Config{Examples: true, Embedded: data}, ""},
		{"examples with a key directory", node.Config{NATSURL: url, Examples: true, DevKeyDir: "/keys"}, ""},
		{"examples with a key set", node.Config{NATSURL: url, Examples: true, JWKSPath: "/keys/jwks.json"}, ""},
		{"examples with a verifier", node.Config{NATSURL: url, Examples: true,
			Stage: node.StageConfig{Tokens: &token.Verifier{}}}, ""},
		{"examples without a key directory", node.Config{NATSURL: url, Examples: true}, "examples: no directory for the development key"},
		{"archiving hourly", node.Config{Embedded: data, Stage: node.StageConfig{AuditArchiveEvery: time.Hour}}, ""},
		{"archiving too seldom for the age limit", node.Config{Embedded: data, Topology: topology.TopologyOptions{AuditMaxAge: 24 * time.Hour},
			Stage: node.StageConfig{AuditArchiveEvery: 12 * time.Hour}}, "not well under AUDIT's age limit"},
		{"archiving a stream kept forever", node.Config{Embedded: data, Topology: topology.TopologyOptions{AuditMaxAge: -1},
			Stage: node.StageConfig{AuditArchiveEvery: 1000 * time.Hour}}, ""},
		{"an archive of another kind", node.Config{Embedded: data, Stage: node.StageConfig{AuditArchive: "ftp://x"}}, "--archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
}
