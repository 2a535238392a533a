package node_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestErrorTextsRedacted: an error's text is an output too. A secret in it
// (a missing file named after a key, a parameter named by one that the
// schema refuses) reaches neither the caller nor the audit trail in clear,
// whichever stage wrote the error.
func TestErrorTextsRedacted(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "public"), 0o755); err != nil {
		t.Fatal(err)
	}
	n := e.startPipeline(node.Config{Stage: node.StageConfig{Builtins: e.builtins(root)}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitForTool(ctx, "fs.read_file", "1.0.0"); err != nil {
		t.Fatal(err)
	}
	const tenant = "errtext"
	c := grant(tenant, "fs.*")
	c.Filesystem = &token.FilesystemGrant{AllowedPaths: []string{"public"}, Mode: "ro"}
	tok := mint(t, c)
	key := "ghp_" + "8rESQedUStPKR0CsTy4Qwb8DwkNhFdnXsiVp"
	for _, params := range []string{
		`{"path":"public/` + key + `.txt"}`,
		`{"path":"public/a.txt","` + key + `":1}`,
	} {
		resp := e.invoke(withTok(request(tenant, "fs.read_file", params), tok))
		if resp.Status == api.StatusSuccess {
			t.Fatalf("%s: succeeded", params)
		}
		if text := mustJSON(t, resp.Error); strings.Contains(text, key) || strings.Contains(text, key[10:]) {
			t.Errorf("%s: the caller got %s", params, text)
		}
	}
	filter := subjects.AuditTenant(tenant)
	for _, m := range e.read(subjects.StreamAudit, filter, e.count(subjects.StreamAudit, filter), 5*time.Second) {
		if strings.Contains(string(m.Data()), key[10:]) {
			t.Errorf("the audit trail holds the key: %s", m.Data())
		}
	}
}
