package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func run(t *testing.T, fn Func, params string) (map[string]any, error) {
	t.Helper()
	out, err := fn(context.Background(), json.RawMessage(params))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("result is not a JSON object: %s", out)
	}
	return m, nil
}

func TestEchoAndNoop(t *testing.T) {
	m, err := run(t, echo, `{"message":"hi","n":12345678901234567890}`)
	if err != nil || m["message"] != "hi" {
		t.Fatalf("echo: %v %v", m, err)
	}
	out, _ := echo(context.Background(), json.RawMessage(`{"n":12345678901234567890}`))
	if !strings.Contains(string(out), "12345678901234567890") {
		t.Fatalf("echo lost precision: %s", out)
	}
	if m, err := run(t, noop, `{"x":1}`); err != nil || len(m) != 0 {
		t.Fatalf("noop: %v %v", m, err)
	}
}

func TestSleepHonoursCancellation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := sleep(ctx, json.RawMessage(`{"ms":60000}`))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("sleep ignored its context")
	}
	if m, err := run(t, sleep, `{"ms":1}`); err != nil || m["slept_ms"] != float64(1) {
		t.Fatalf("sleep: %v %v", m, err)
	}
}

func TestJSONTransform(t *testing.T) {
	cases := []struct{ params, want string }{
		{`{"data":{"a":{"b":[3,1,2]}},"pointer":"/a/b","op":"sort"}`, `{"result":[1,2,3]}`},
		{`{"data":{"a":1,"b":2,"c":3},"pick":["a","c"]}`, `{"result":{"a":1,"c":3}}`},
		{`{"data":{"x/y":{"~":"v"}},"pointer":"/x~1y/~0"}`, `{"result":"v"}`},
		{`{"data":{"b":1,"a":2},"op":"keys"}`, `{"result":["a","b"]}`},
		{`{"data":"héllo","op":"length"}`, `{"result":5}`},
		{`{"data":["b","a"],"op":"sort"}`, `{"result":["a","b"]}`},
		{`{"data":12345678901234567890}`, `{"result":12345678901234567890}`},
	}
	for _, c := range cases {
		out, err := jsonTransform(context.Background(), json.RawMessage(c.params))
		if err != nil || string(out) != c.want {
			t.Fatalf("%s: %s, %v; want %s", c.params, out, err, c.want)
		}
	}
	for _, bad := range []string{
		`{"data":{"a":1},"pointer":"/b"}`, `{"data":[1],"pointer":"/5"}`, `{"data":1,"pick":["a"]}`,
		`{"data":[1,"a"],"op":"sort"}`, `{"data":1,"op":"keys"}`, `{"data":1,"op":"explode"}`, `{"data":1,"pointer":"a"}`,
	} {
		_, err := jsonTransform(context.Background(), json.RawMessage(bad))
		if !errors.Is(err, api.ErrInvalidParameters) {
			t.Fatalf("%s: err = %v, want invalid_parameters", bad, err)
		}
	}
}

// sandbox makes root/ with files and, beside it, a secret outside the root
// and a sibling root_evil directory.
func sandbox(t *testing.T) (root, secret string) {
	t.Helper()
	base := t.TempDir()
	root = filepath.Join(base, "root")
	must(t, os.MkdirAll(filepath.Join(root, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("alpha"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "sub", "b.txt"), []byte("bravo"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "bin.dat"), []byte{0xff, 0xfe, 0x00}, 0o644))
	secret = filepath.Join(base, "secret.txt")
	must(t, os.WriteFile(secret, []byte("TOPSECRET"), 0o644))
	must(t, os.MkdirAll(filepath.Join(base, "root_evil"), 0o755))
	must(t, os.WriteFile(filepath.Join(base, "root_evil", "f"), []byte("TOPSECRET"), 0o644))
	must(t, os.Symlink(secret, filepath.Join(root, "link-out")))
	must(t, os.Symlink("sub/../a.txt", filepath.Join(root, "link-in"))) // relative, stays inside
	must(t, syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	return root, secret
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestReadFile(t *testing.T) {
	root, secret := sandbox(t)
	rf := readFile(root)
	m, err := run(t, rf, `{"path":"sub/b.txt"}`)
	if err != nil || m["content"] != "bravo" || m["path"] != "sub/b.txt" || m["truncated"] != false || m["size"] != float64(5) {
		t.Fatalf("read: %v %v", m, err)
	}
	if m, err = run(t, rf, `{"path":"/a.txt","max_bytes":2}`); err != nil || m["content"] != "al" || m["truncated"] != true {
		t.Fatalf("truncated read: %v %v", m, err)
	}
	if m, err = run(t, rf, `{"path":"link-in"}`); err != nil || m["content"] != "alpha" {
		t.Fatalf("a link inside the root: %v %v", m, err)
	}
	if m, err = run(t, rf, `{"path":"bin.dat"}`); err != nil || m["encoding"] != "base64" {
		t.Fatalf("binary content: %v %v", m, err)
	}
	for _, p := range []string{"../secret.txt", "sub/../../secret.txt", "link-out", "../root_evil/f", secret, "/etc/shadow", "/etc/passwd"} {
		out, err := rf(context.Background(), mustJSON(map[string]string{"path": p}))
		if err == nil || strings.Contains(string(out), "TOPSECRET") || strings.Contains(string(out), "root:") {
			t.Fatalf("%q escaped the root: %s, %v", p, out, err)
		}
	}
	for _, p := range []string{"link-out", "sub", "fifo"} {
		_, err := rf(context.Background(), mustJSON(map[string]string{"path": p}))
		if !errors.Is(err, api.ErrPermissionDenied) {
			t.Fatalf("%q: err = %v, want permission_denied", p, err)
		}
	}
	if _, err := readFile("")(context.Background(), json.RawMessage(`{"path":"a.txt"}`)); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("no root: %v", err)
	}
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func FuzzReadFilePath(f *testing.F) {
	for _, s := range []string{"a.txt", "../secret.txt", "/../../secret.txt", "link-out", "sub/../a.txt", "....//", "%2e%2e/secret.txt"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		root, _ := sandbox(t)
		out, _ := readFile(root)(context.Background(), mustJSON(map[string]string{"path": p}))
		if strings.Contains(string(out), "TOPSECRET") {
			t.Fatalf("%q read a file outside the root", p)
		}
	})
}

func FuzzJSONTransform(f *testing.F) {
	f.Add(`{"data":{"a":[1,2]},"pointer":"/a/1","op":"length"}`)
	f.Add(`{"data":[3,"x"],"op":"sort"}`)
	f.Fuzz(func(t *testing.T, params string) {
		out, err := jsonTransform(context.Background(), json.RawMessage(params))
		if err == nil && !json.Valid(out) {
			t.Fatalf("invalid JSON result %s", out)
		}
	})
}
