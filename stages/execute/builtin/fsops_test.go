package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fsSandbox is sandbox plus directory symlinks: one leading out of the root
// and one staying inside, so escapes through the middle of a path are
// covered as well as through its last component.
func fsSandbox(t *testing.T) (root, secret string) {
	t.Helper()
	root, secret = sandbox(t)
	must(t, os.Symlink(filepath.Dir(secret), filepath.Join(root, "dir-out")))
	must(t, os.Symlink("sub", filepath.Join(root, "dir-in")))
	return root, secret
}

// escapes are paths that must never reach outside the root, for any of the
// file builtins.
func escapes(secret string) []string {
	return []string{
		"../secret.txt", "sub/../../secret.txt", "..", "../root_evil/f", // parent segments
		"link-out",             // a symlink leading out
		"dir-out/secret.txt",   // a symlink in the middle of the path
		"dir-out/root_evil/f",  // the same, one level further
		"dir-out/new-file.txt", // a file that does not exist yet, out there
		"sub/../dir-out/x.txt", // parent segment that stays inside, then out
		"dir-in/../../secret.txt",
	}
}

func wantCode(t *testing.T, what string, err error, code api.Code, ecode string) {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.Code != code || te.ECode != ecode {
		t.Fatalf("%s: err = %v, want %s %s", what, err, code, ecode)
	}
}

func TestWriteFile(t *testing.T) {
	root, secret := fsSandbox(t)
	wf := writeFile(root)
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	m, err := run(t, wf, `{"path":"new.txt","content":"hello"}`)
	if err != nil || m["created"] != true || m["bytes_written"] != float64(5) || m["mode"] != "0644" || read("new.txt") != "hello" {
		t.Fatalf("create: %v %v", m, err)
	}
	must(t, os.Chmod(filepath.Join(root, "a.txt"), 0o600))
	if m, err = run(t, wf, `{"path":"a.txt","content":"replaced"}`); err != nil || m["created"] != false || m["mode"] != "0600" || read("a.txt") != "replaced" {
		t.Fatalf("overwrite keeps the mode: %v %v", m, err)
	}
	if m, err = run(t, wf, `{"path":"sub/m.bin","content":"//79","encoding":"base64","mode":"0600"}`); err != nil || read("sub/m.bin") != "\xff\xfe\xfd" {
		t.Fatalf("base64: %v %v", m, err)
	}
	if fi, _ := os.Stat(filepath.Join(root, "sub/m.bin")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode())
	}
	if _, err = run(t, wf, `{"path":"deep/er/x.txt","content":"x","create_dirs":true}`); err != nil || read("deep/er/x.txt") != "x" {
		t.Fatalf("create_dirs: %v", err)
	}
	if _, err = run(t, wf, `{"path":"dir-in/via-link.txt","content":"in"}`); err != nil || read("sub/via-link.txt") != "in" {
		t.Fatalf("a directory symlink inside the root: %v", err)
	}
	_, err = run(t, wf, `{"path":"new.txt","content":"again","overwrite":false}`)
	wantCode(t, "overwrite false", err, api.ToolExecutionError, api.EToolFailed)
	if read("new.txt") != "hello" {
		t.Fatal("overwrite false replaced the file")
	}
	if _, err = run(t, wf, `{"path":"fresh.txt","content":"f","overwrite":false}`); err != nil || read("fresh.txt") != "f" {
		t.Fatalf("overwrite false on a new file: %v", err)
	}
	_, err = run(t, wf, `{"path":"missing/x.txt","content":"x"}`)
	wantCode(t, "missing parent", err, api.ToolExecutionError, api.EToolFailed)

	for _, p := range escapes(secret) {
		_, err := wf(context.Background(), mustJSON(map[string]string{"path": p, "content": "PWNED"}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
	// Not regular files: the FIFO is neither opened (which would block)
	// nor replaced; a symlink inside the root is not replaced either.
	for _, p := range []string{"fifo", "sub", "link-in", "dir-in"} {
		_, err := wf(context.Background(), mustJSON(map[string]string{"path": p, "content": "x"}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
	if fi, err := os.Lstat(filepath.Join(root, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the FIFO was replaced: %v %v", fi, err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "TOPSECRET" {
		t.Fatalf("secret changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(secret), "new-file.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was created outside the root: %v", err)
	}

	for _, bad := range []string{
		`{"path":"","content":"x"}`, `{"path":".","content":"x"}`, `{"path":"x","content":"!!","encoding":"base64"}`,
		`{"path":"x","content":"x","encoding":"utf16"}`, `{"path":"x","content":"x","mode":"4755"}`, `{"path":"x","content":"x","mode":"rw"}`,
		`{"path":"x\u0000y","content":"x"}`,
	} {
		_, err := wf(context.Background(), json.RawMessage(bad))
		wantCode(t, bad, err, api.InvalidParameters, api.EParametersInvalid)
	}
	big := strings.Repeat("x", maxWriteBytes+1)
	_, err = wf(context.Background(), mustJSON(map[string]string{"path": "big.txt", "content": big}))
	wantCode(t, "over the size cap", err, api.InvalidParameters, api.EParameterBounds)

	// No temporary files are left behind, whatever happened above.
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if strings.Contains(d.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
	_, err = writeFile("")(context.Background(), json.RawMessage(`{"path":"a","content":"x"}`))
	wantCode(t, "no root", err, api.PermissionDenied, api.EPathOutsideRoots)
}

func TestAppendFile(t *testing.T) {
	root, secret := fsSandbox(t)
	af := appendFile(root)
	m, err := run(t, af, `{"path":"log.txt","content":"one\n"}`)
	if err != nil || m["size"] != float64(4) {
		t.Fatalf("create: %v %v", m, err)
	}
	if m, err = run(t, af, `{"path":"log.txt","content":"two\n"}`); err != nil || m["size"] != float64(8) || m["bytes_appended"] != float64(4) {
		t.Fatalf("append: %v %v", m, err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "log.txt")); string(b) != "one\ntwo\n" {
		t.Fatalf("content %q", b)
	}
	// A symlink inside the root is followed, as os.Root allows.
	if _, err = run(t, af, `{"path":"link-in","content":"+"}`); err != nil {
		t.Fatalf("link inside: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "a.txt")); string(b) != "alpha+" {
		t.Fatalf("a.txt = %q", b)
	}
	_, err = run(t, af, `{"path":"nope.txt","content":"x","create":false}`)
	wantCode(t, "create false", err, api.ToolExecutionError, api.EToolFailed)

	for _, p := range escapes(secret) {
		_, err := af(context.Background(), mustJSON(map[string]string{"path": p, "content": "PWNED"}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
	if b, _ := os.ReadFile(secret); string(b) != "TOPSECRET" {
		t.Fatalf("secret changed: %q", b)
	}
	for _, p := range []string{"fifo", "sub"} {
		_, err := af(context.Background(), mustJSON(map[string]string{"path": p, "content": "x"}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
	// A FIFO with a reader opens; the check on the descriptor still refuses.
	r, err := os.OpenFile(filepath.Join(root, "fifo"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	must(t, err)
	defer r.Close()
	_, err = af(context.Background(), json.RawMessage(`{"path":"fifo","content":"x"}`))
	wantCode(t, "fifo with a reader", err, api.PermissionDenied, api.EPathOutsideRoots)

	must(t, os.WriteFile(filepath.Join(root, "full.txt"), make([]byte, maxAppendFileBytes-2), 0o644))
	_, err = run(t, af, `{"path":"full.txt","content":"abc"}`)
	wantCode(t, "over the file cap", err, api.InvalidParameters, api.EParameterBounds)
}

func TestListDir(t *testing.T) {
	root, secret := fsSandbox(t)
	ld := listDir(root)
	out, err := ld(context.Background(), json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Path    string `json:"path"`
		Entries []struct {
			Name, Type string
			Size       int64
		} `json:"entries"`
		Truncated bool `json:"truncated"`
	}
	must(t, json.Unmarshal(out, &res))
	got := map[string]string{}
	var names []string
	for _, e := range res.Entries {
		got[e.Name] = e.Type
		names = append(names, e.Name)
		if e.Name == "a.txt" && e.Size != 5 {
			t.Errorf("a.txt size %d", e.Size)
		}
	}
	want := map[string]string{"a.txt": "file", "sub": "dir", "bin.dat": "file", "link-out": "symlink", "link-in": "symlink",
		"fifo": "fifo", "dir-out": "symlink", "dir-in": "symlink"}
	for n, ty := range want {
		if got[n] != ty {
			t.Errorf("%s: type %q, want %q (%s)", n, got[n], ty, out)
		}
	}
	if res.Path != "." || res.Truncated || len(res.Entries) != len(want) || !sortedStrings(names) {
		t.Fatalf("listing: %s", out)
	}
	if m, err := run(t, ld, `{"path":"dir-in"}`); err != nil || len(m["entries"].([]any)) != 1 {
		t.Fatalf("a directory symlink inside: %v %v", m, err)
	}
	if m, err := run(t, ld, `{"path":".","max_entries":3}`); err != nil || len(m["entries"].([]any)) != 3 || m["truncated"] != true {
		t.Fatalf("max_entries: %v %v", m, err)
	}
	for _, p := range escapes(secret) {
		out, err := ld(context.Background(), mustJSON(map[string]string{"path": p}))
		if err == nil || strings.Contains(string(out), "root_evil") {
			t.Fatalf("%q listed outside the root: %s", p, out)
		}
	}
	for _, p := range []string{"dir-out", "dir-out/root_evil", "../"} {
		_, err := ld(context.Background(), mustJSON(map[string]string{"path": p}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
	// A FIFO is not opened for reading, which would block.
	for _, p := range []string{"fifo", "a.txt"} {
		_, err := ld(context.Background(), mustJSON(map[string]string{"path": p}))
		wantCode(t, p, err, api.InvalidParameters, api.EParametersInvalid)
	}
	_, err = run(t, ld, `{"max_entries":100000}`)
	wantCode(t, "max_entries", err, api.InvalidParameters, api.EParametersInvalid)
}

// TestLeadingSlashMeansRoot: a path parameter with a leading slash names the
// same place under the file root as one without (token.CleanPath), for every
// fs builtin; an absolute host path never reaches the host.
func TestLeadingSlashMeansRoot(t *testing.T) {
	root, secret := fsSandbox(t)
	for _, p := range []string{"/sub/slash.txt", "sub/plain.txt", "./sub/dot.txt"} {
		if _, err := run(t, writeFile(root), mustJSONString(map[string]string{"path": p, "content": "w"})); err != nil {
			t.Fatalf("write %s: %v", p, err)
		}
		if _, err := run(t, appendFile(root), mustJSONString(map[string]string{"path": p, "content": "a"})); err != nil {
			t.Fatalf("append %s: %v", p, err)
		}
		if b, err := os.ReadFile(filepath.Join(root, "sub", filepath.Base(p))); err != nil || string(b) != "wa" {
			t.Fatalf("%s: %q, %v", p, b, err)
		}
		for name, f := range map[string]Func{"read_file": readFile(root), "stat": statFile(root)} {
			if _, err := run(t, f, mustJSONString(map[string]string{"path": p})); err != nil {
				t.Fatalf("%s %s: %v", name, p, err)
			}
		}
	}
	for _, p := range []string{"/", "/sub"} {
		if _, err := run(t, listDir(root), mustJSONString(map[string]string{"path": p})); err != nil {
			t.Fatalf("list_dir %s: %v", p, err)
		}
	}
	// The host path of the secret, read as a path under the root, names
	// nothing there.
	if _, err := run(t, readFile(root), mustJSONString(map[string]string{"path": secret})); err == nil {
		t.Fatalf("read_file %s reached the host", secret)
	}
}

func mustJSONString(v any) string { return string(mustJSON(v)) }

func sortedStrings(s []string) bool {
	for i := 1; i < len(s); i++ {
		if s[i-1] > s[i] {
			return false
		}
	}
	return true
}

func TestStat(t *testing.T) {
	root, secret := fsSandbox(t)
	st := statFile(root)
	cases := []struct {
		path, typ string
		size      float64
		link      bool
	}{
		{"a.txt", "file", 5, false},
		{"sub", "dir", 0, false},
		{"fifo", "fifo", 0, false},
		{"link-in", "file", 5, true},
		{"dir-in", "dir", 0, true},
		{"dir-in/b.txt", "file", 5, false},
	}
	for _, c := range cases {
		m, err := run(t, st, string(mustJSON(map[string]string{"path": c.path})))
		if err != nil || m["exists"] != true || m["type"] != c.typ || m["size"] != c.size || m["symlink"] != c.link || m["modified_at"] == "" {
			t.Fatalf("%s: %v %v", c.path, m, err)
		}
	}
	if m, err := run(t, st, `{"path":"nothing/here"}`); err != nil || m["exists"] != false {
		t.Fatalf("missing: %v %v", m, err)
	}
	for _, p := range escapes(secret) {
		_, err := st(context.Background(), mustJSON(map[string]string{"path": p}))
		wantCode(t, p, err, api.PermissionDenied, api.EPathOutsideRoots)
	}
}

// TestFileContracts holds each file builtin's results to its example
// manifest's output schema.
func TestFileContracts(t *testing.T) {
	root, _ := fsSandbox(t)
	set := New(Env{FileRoot: root})
	calls := []struct{ tool, params string }{
		{"fs.write_file", `{"path":"c.txt","content":"x","mode":"600"}`},
		{"fs.append_file", `{"path":"c.txt","content":"y"}`},
		{"fs.list_dir", `{"path":"sub"}`},
		{"fs.list_dir", `{}`},
		{"fs.stat", `{"path":"c.txt"}`},
		{"fs.stat", `{"path":"none"}`},
		{"parse.json", `{"text":"{\"a\":[1,2.5,null]}"}`},
		{"parse.yaml", `{"text":"a: [1, b]\n2: 2020-01-02T03:04:05Z\n"}`},
		{"math.eval", `{"expression":"7/2"}`},
		{"math.eval", `{"expression":"pow(2, 100)"}`},
	}
	checkContracts(t, set, calls)
}

func checkContracts(t *testing.T, set Set, calls []struct{ tool, params string }) {
	t.Helper()
	ms, err := tools.Examples()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*tools.Manifest{}
	for _, m := range ms {
		byID[m.ID] = m
	}
	for _, c := range calls {
		m := byID[c.tool]
		if m == nil {
			t.Fatalf("no example manifest %s", c.tool)
		}
		if fields, err := m.ValidateInput([]byte(c.params)); err != nil || fields != nil {
			t.Fatalf("%s %s: input schema: %v %v", c.tool, c.params, fields, err)
		}
		fn := set[m.Builtin.Function]
		if fn == nil {
			t.Fatalf("%s: builtin %q is not registered", c.tool, m.Builtin.Function)
		}
		out, err := fn(context.Background(), json.RawMessage(c.params))
		if err != nil {
			t.Fatalf("%s %s: %v", c.tool, c.params, err)
		}
		if fields, err := m.ValidateOutput(out); err != nil || fields != nil {
			t.Fatalf("%s %s: output %s fails its schema: %v %v", c.tool, c.params, out, fields, err)
		}
	}
}
