package main

import (
	"strings"
	"testing"
)

// TestConsoleAllowHostNeeded: a console listening on every address names
// no host a browser opens, so it needs --allow-host (serve --console too).
func TestConsoleAllowHostNeeded(t *testing.T) {
	cleanEnv(t)
	for _, tc := range []struct{ args []string }{
		{[]string{"console", "--listen", "0.0.0.0:8443", "--tls-cert", "c.pem", "--tls-key", "k.pem"}},
		{[]string{"console", "--listen", "[::]:8443", "--tls-cert", "c.pem", "--tls-key", "k.pem"}},
		{[]string{"serve", "--data", t.TempDir(), "--console", ":8443", "--console-tls-cert", "c.pem", "--console-tls-key", "k.pem"}},
	} {
		r := tg(t, "", append(tc.args, "--nats", "nats://127.0.0.1:1")...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "allow-host") {
			t.Fatalf("%v: exit %d, stderr %q", tc.args, r.code, r.stderr)
		}
	}
}
