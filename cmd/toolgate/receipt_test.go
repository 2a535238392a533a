package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/token"
)

// TestReceiptGetAndVerify: receipt get prints an ended call's receipt
// with its proof, and receipt verify checks it offline with
// audit-chain.pub and the result; a receipt with one byte changed, another
// result, the proof of another call and a file that is no receipt are
// each refused with their code and a non-zero exit.
func TestReceiptGetAndVerify(t *testing.T) {
	cleanEnv(t)
	s := startToolgate(t)
	dir := t.TempDir()
	key := filepath.Join(s.data, busauth.DirName, busauth.AuditChainPublicFile)
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	call := func(message string) (api.Response, string) {
		r := tg(t, "", s.flags("invoke", "echo", "--params", `{"message":"`+message+`"}`, "--wait", "--json")...)
		var resp api.Response
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &resp) != nil || resp.Receipt == nil {
			t.Fatalf("invoke: %+v", r)
		}
		g := tg(t, "", s.flags("receipt", "get", resp.InvocationID, "--wait", "60s")...)
		if g.code != exitOK || !strings.Contains(g.stdout, `"proof"`) {
			t.Fatalf("receipt get: %+v", g)
		}
		return resp, g.stdout
	}
	resp, got := call("receipted")
	file := write("receipt.json", got)
	result := write("result.json", "\n"+string(resp.Result)+"\n")
	r := tg(t, "", "receipt", "verify", file, "--key", key, "--result", result)
	if r.code != exitOK || !strings.Contains(r.stdout, "verifies: signature, result, proof (AUDIT seq") {
		t.Fatalf("receipt verify: %+v", r)
	}
	// The bare receipt, as MCP's _meta carries it.
	bare, _ := json.Marshal(resp.Receipt)
	if r := tg(t, "", "receipt", "verify", write("bare.json", string(bare)), "--key", key); r.code != exitOK {
		t.Fatalf("receipt verify of the bare receipt: %+v", r)
	}

	t.Run("its agent, with its token alone", func(t *testing.T) {
		// The agent gets its own call's proof with the checkpoint's head:
		// nothing in it names another call; it checks offline.
		tok := agentToken(t, s, "receipt-agent", time.Hour, "echo")
		asAgent := func(args ...string) []string { return append(args, "--nats", s.url, "--token", tok) }
		r := tg(t, "", asAgent("invoke", "echo", "--params", `{"message":"mine"}`, "--wait", "--json")...)
		var resp api.Response
		if r.code != exitOK || json.Unmarshal([]byte(r.stdout), &resp) != nil {
			t.Fatalf("invoke as the agent: %+v", r)
		}
		g := tg(t, "", asAgent("receipt", "get", resp.InvocationID, "--wait", "60s")...)
		var rr struct {
			Proof struct {
				EventID    string                     `json:"event_id"`
				Checkpoint map[string]json.RawMessage `json:"checkpoint"`
			} `json:"proof"`
		}
		if g.code != exitOK || json.Unmarshal([]byte(g.stdout), &rr) != nil || rr.Proof.Checkpoint == nil {
			t.Fatalf("receipt get as the agent: %+v", g)
		}
		for _, k := range []string{"ids", "tenants", "leaves"} {
			if _, ok := rr.Proof.Checkpoint[k]; ok {
				t.Errorf("the agent's proof shows the checkpoint's %s: %s", k, g.stdout)
			}
		}
		if _, ok := rr.Proof.Checkpoint["listing"]; !ok || strings.Count(g.stdout, ":tool.") != 2 { // the receipt's and the proof's event id
			t.Errorf("the agent's proof: %s", g.stdout)
		}
		mine := write("mine.json", g.stdout)
		if r := tg(t, "", "receipt", "verify", mine, "--key", key); r.code != exitOK || !strings.Contains(r.stdout, "proof (AUDIT seq") {
			t.Fatalf("receipt verify of the agent's proof: %+v", r)
		}
		// Another agent of the tenant is refused (and audited).
		k, err := token.LoadSigningKey(filepath.Join(s.data, "dev-signing-key.jwk"))
		if err != nil {
			t.Fatal(err)
		}
		other := mintFor(t, k, "did:agent:other", "other-agent", time.Hour, false, "echo")
		if r := tg(t, "", "receipt", "get", resp.InvocationID, "--nats", s.url, "--token", other); r.code == exitOK || !strings.Contains(r.stderr, api.ENotOwnCall) {
			t.Fatalf("another agent's receipt get: %+v", r)
		}
	})

	_, other := call("another")
	var rr, or map[string]json.RawMessage
	if err := json.Unmarshal([]byte(got), &rr); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(other), &or); err != nil {
		t.Fatal(err)
	}
	rr["proof"] = or["proof"]
	otherProof, _ := json.Marshal(rr)
	// One byte changed: the first digit of the result's hash.
	loc := regexp.MustCompile(`"result_sha256":\s*"`).FindStringIndex(got)
	if loc == nil {
		t.Fatalf("no result_sha256 in %s", got)
	}
	i := loc[1]
	flip := map[byte]byte{'0': '1'}
	c := got[i]
	if f, ok := flip[c]; ok {
		c = f
	} else {
		c = '0'
	}
	changed := got[:i] + string(c) + got[i+1:]
	for _, tc := range []struct {
		name, file, result string
		code               int
		ecode              string
	}{
		{"one byte changed", write("changed.json", changed), "", exitDenied, api.EReceiptForged},
		{"another result", file, write("other.json", `{"message":"another"}`), exitError, api.EReceiptResult},
		{"another call's proof", write("other-proof.json", string(otherProof)), "", exitDenied, api.EReceiptProof},
		{"no receipt", write("empty.json", `{"receipt":null}`), "", exitError, api.EReceiptMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"receipt", "verify", tc.file, "--key", key}
			if tc.result != "" {
				args = append(args, "--result", tc.result)
			}
			r := tg(t, "", args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.ecode) {
				t.Fatalf("exit %d, want %d with %s: %+v", r.code, tc.code, tc.ecode, r)
			}
		})
	}
}
