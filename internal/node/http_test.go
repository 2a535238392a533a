package node_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestHTTPTools runs http tools through every stage against a real server:
// a credential from --secrets-dir is injected and appears nowhere toolgate
// writes; a redirect off the allowlist is refused; a 429 is retried after
// its Retry-After; a host the token does not grant is refused at authorize.
func TestHTTPTools(t *testing.T) {
	const secret = "tg-Secret/value+123=="
	var flaky atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/echo":
			if r.Header.Get("X-Api-Key") != secret {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			// A careless service echoing the credential back, plainly and encoded.
			w.Header().Set("X-Echo", r.Header.Get("X-Api-Key"))
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"key": r.Header.Get("X-Api-Key"),
				"b64": base64.StdEncoding.EncodeToString([]byte(secret)), "hello": "world"})
		case "/redirect":
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
		case "/flaky":
			if flaky.Add(1) == 1 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				return
			}
			_, _ = io.WriteString(w, "ok")
		default:
			_, _ = io.WriteString(w, "plain text")
		}
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	port, _ := strconv.Atoi(u.Port())

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "echo_key"), []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, topology.TopologyOptions{})
	n := e.startPipeline(node.Config{Stage: node.StageConfig{SecretsDir: dir}})
	registerTools(t, n, fmt.Sprintf(`{"id":"test.http_echo","name":"http echo","version":"1.0.0","description":"calls the test service",
	  "kind":"http","http":{"url":"http://127.0.0.1:%d/{{path}}?to={{to}}","response_headers":["x-echo"],
	    "credentials":[{"secret":"echo_key","header":"X-Api-Key"}]},
	  "input_schema":{"type":"object"},"output_schema":{"type":"object"},"safety":{"idempotent":true},
	  "permissions":{"network":[{"host":"127.0.0.1","port":%d}],"credentials":["echo_key"]},
	  "retry_policy":{"max_attempts":3,"base_delay_ms":5,"max_delay_ms":3000}}`, port, port))
	tok := func(tenant string, hosts ...string) string {
		c := grant(tenant, "test.http_echo", "http.get")
		c.Network = &token.NetworkGrant{AllowedHosts: hosts, AllowedPorts: []int{port}}
		c.Credentials = &token.CredentialGrant{AllowedSecrets: []string{"echo_key"}}
		return mint(t, c)
	}
	call := func(tenant, tool, params string, hosts ...string) api.Response {
		return e.invoke(withTok(request(tenant, tool, params), tok(tenant, hosts...)))
	}
	// leaks fails the test if the secret, or its base64 form, is in b.
	leaks := func(what string, b []byte) {
		t.Helper()
		for _, form := range []string{secret, base64.StdEncoding.EncodeToString([]byte(secret)), url.QueryEscape(secret)} {
			if strings.Contains(string(b), form) {
				t.Fatalf("%s holds the secret: %s", what, b)
			}
		}
	}

	// Success with the injected credential.
	resp := call("hok", "test.http_echo", `{"path":"echo"}`, "127.0.0.1")
	if resp.Status != api.StatusSuccess {
		t.Fatalf("echo: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	var res struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    map[string]string `json:"body"`
	}
	if err := json.Unmarshal(resp.Result, &res); err != nil || res.Status != 200 || res.Body["hello"] != "world" ||
		res.Body["key"] != "[REDACTED]" || res.Headers["x-echo"] != "[REDACTED]" {
		t.Fatalf("result %s: %v", resp.Result, err)
	}
	leaks("the result", resp.Result)
	for _, m := range e.read(subjects.StreamAudit, subjects.AuditTenant("hok"), e.count(subjects.StreamAudit, subjects.AuditTenant("hok")), 10*time.Second) {
		leaks("an audit event", m.Data())
	}
	for _, m := range e.read(subjects.StreamResults, subjects.ResultTenant("hok"), 1, 10*time.Second) {
		leaks("the result event", m.Data())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := e.client.Status(ctx, "hok", resp.InvocationID)
	if err != nil {
		t.Fatal(err)
	}
	leaks("the status record", []byte(mustJSON(t, rec)))

	// A redirect to a host off the allowlist is refused, and audited.
	resp = call("hredir", "test.http_echo", fmt.Sprintf(`{"path":"redirect","to":"http://localhost:%d/echo"}`, port), "127.0.0.1")
	expectDenied(t, resp, api.StatusPermissionDenied, api.ENetworkPolicy)
	if c := e.count(subjects.StreamAudit, subjects.AuditEvent("hredir", envelope.SubjectSuffix(api.TypePermissionDenied))); c != 1 {
		t.Fatalf("%d permission_denied audit events, want 1", c)
	}
	leaks("the refusal", []byte(mustJSON(t, resp)))

	// A 429 is retried after its Retry-After, then succeeds.
	start := time.Now()
	resp = call("hretry", "test.http_echo", `{"path":"flaky"}`, "127.0.0.1")
	if resp.Status != api.StatusSuccess || resp.ExecutionMetadata.Attempts != 2 {
		t.Fatalf("flaky: %s %s attempts %d", resp.Status, mustJSON(t, resp.Error), resp.ExecutionMetadata.Attempts)
	}
	if d := time.Since(start); d < time.Second {
		t.Fatalf("retried after %v, before the service's Retry-After of 1s", d)
	}

	// http.get reaches a granted host, and a host the token does not grant
	// is refused at authorize.
	resp = call("hget", "http.get", fmt.Sprintf(`{"url":"http://127.0.0.1:%d/plain"}`, port), "127.0.0.1")
	if resp.Status != api.StatusSuccess || !strings.Contains(string(resp.Result), `"body":"plain text"`) {
		t.Fatalf("http.get: %s %s %s", resp.Status, resp.Result, mustJSON(t, resp.Error))
	}
	resp = call("hdeny", "http.get", fmt.Sprintf(`{"url":"http://localhost:%d/plain"}`, port), "127.0.0.1")
	expectDenied(t, resp, api.StatusPermissionDenied, api.ENetworkDenied)
	if c := e.count(subjects.StreamAudit, subjects.AuditEvent("hdeny", envelope.SubjectSuffix(api.TypePermissionDenied))); c != 1 {
		t.Fatalf("%d permission_denied audit events, want 1", c)
	}

	// The secrets directory gone: the source cannot be reached (E3301),
	// which is not the same as a secret it lacks (E3302); nothing is sent.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	resp = call("hnosrc", "test.http_echo", `{"path":"echo"}`, "127.0.0.1")
	if resp.Status != api.StatusError || resp.Error == nil || resp.Error.ECode != api.ESecretSourceUnreachable ||
		resp.Error.Code != api.ToolExecutionError || resp.Error.Details["not_started"] != true {
		t.Fatalf("secrets directory gone: %s %s", resp.Status, mustJSON(t, resp.Error))
	}
	leaks("the refusal", []byte(mustJSON(t, resp)))
}
