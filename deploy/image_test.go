package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestImage runs the image `make image` built ($IMAGE, default
// toolgate:latest) the way a container runtime would: exported as an OCI
// layout by the engine that built it (deploy/image/build.sh export),
// unpacked with umoci, its entrypoint run under bwrap as the image's user
// in the image's working directory and environment. It checks the image's
// configuration and file ownership, `toolgate version`, and `toolgate serve`
// with its embedded NATS answering /healthz and /readyz and running a cli
// tool in bubblewrap inside the image.
//
// Building takes minutes, so it runs only with TOOLGATE_IMAGE_TEST=1
// (`make image-test` builds the image first); `make test` skips it.
func TestImage(t *testing.T) {
	if os.Getenv("TOOLGATE_IMAGE_TEST") != "1" {
		t.Skip("runs the built image; set TOOLGATE_IMAGE_TEST=1 (make image-test)")
	}
	for _, tool := range []string{"bwrap", "umoci"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run the image (Debian: apt-get install bubblewrap umoci)", tool)
		}
	}
	dir := t.TempDir()
	layout := filepath.Join(dir, "oci")
	command(t, exec.Command("image/build.sh", "export", layout))
	cfg, layers := readLayout(t, layout)

	t.Run("config", func(t *testing.T) {
		if cfg.Config.User != "10001:10001" {
			t.Errorf("user %q: want the numeric non-root 10001:10001 (runAsNonRoot checks a numeric user)", cfg.Config.User)
		}
		if want := []string{"/usr/local/bin/toolgate"}; strings.Join(cfg.Config.Entrypoint, " ") != strings.Join(want, " ") {
			t.Errorf("entrypoint %q, want %q", cfg.Config.Entrypoint, want)
		}
		if cfg.Config.WorkingDir != "/var/lib/toolgate" {
			t.Errorf("working directory %q", cfg.Config.WorkingDir)
		}
		if _, ok := cfg.Config.ExposedPorts["9464/tcp"]; !ok {
			t.Errorf("exposed ports %v: want 9464/tcp (metrics and probes)", cfg.Config.ExposedPorts)
		}
	})

	t.Run("files", func(t *testing.T) {
		files := lastHeaders(t, layout, layers)
		for _, f := range []struct {
			path     string
			uid      int
			dir      bool
			writable bool // by the user 10001
		}{
			{"usr/local/bin/toolgate", 0, false, false},
			{"usr/bin/bwrap", 0, false, false},
			{"usr/bin/prlimit", 0, false, false},
			{"var/lib/toolgate", 10001, true, true},
			{"srv/toolgate-files", 10001, true, true},
		} {
			h, ok := files[f.path]
			switch {
			case !ok:
				t.Errorf("%s: not in the image", f.path)
			case h.Uid != f.uid:
				t.Errorf("%s: owner %d, want %d", f.path, h.Uid, f.uid)
			case (h.Typeflag == tar.TypeDir) != f.dir:
				t.Errorf("%s: type %c", f.path, h.Typeflag)
			case !f.writable && h.Mode&0o022 != 0:
				t.Errorf("%s: mode %o writable by group or others", f.path, h.Mode)
			case f.writable && h.Mode&0o200 == 0:
				t.Errorf("%s: mode %o not writable by its owner", f.path, h.Mode)
			}
		}
	})

	bundle := filepath.Join(dir, "bundle")
	command(t, exec.Command("umoci", "unpack", "--rootless", "--image", layout+":latest", bundle))
	c := newContainer(t, filepath.Join(bundle, "rootfs"), cfg)

	t.Run("version", func(t *testing.T) {
		out := command(t, c.command(context.Background(), "version", "--json"))
		var v struct {
			GoVersion string `json:"go_version"`
			Platform  string `json:"platform"`
			Modules   []struct{ Path string }
		}
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("version --json: %v\n%s", err, out)
		}
		var nats bool
		for _, m := range v.Modules {
			nats = nats || m.Path == "github.com/nats-io/nats-server/v2"
		}
		if !strings.HasPrefix(v.GoVersion, "go1.") || v.Platform != "linux/amd64" && v.Platform != "linux/arm64" || !nats {
			t.Errorf("version: %s", out)
		}
		// The entrypoint runs as the image's user, not as root.
		if id := strings.TrimSpace(string(command(t, c.exec(context.Background(), "/usr/bin/id", "-u")))); id != "10001" {
			t.Errorf("id -u in the image: %s", id)
		}
	})

	t.Run("serve", func(t *testing.T) {
		natsPort, metricsPort := freePort(t), freePort(t)
		ctx, cancel := context.WithCancel(context.Background())
		serve := c.command(ctx, "serve", "--examples",
			"--listen", "127.0.0.1:"+natsPort, "--metrics-addr", "127.0.0.1:"+metricsPort)
		var log syncBuffer
		serve.Stdout, serve.Stderr = &log, &log
		if err := serve.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		var exitErr error
		go func() { exitErr = serve.Wait(); close(exited) }()
		t.Cleanup(func() {
			cancel()
			<-exited
			if t.Failed() {
				t.Logf("toolgate serve in the image:\n%s", log.String())
			}
		})

		for _, path := range []string{"/healthz", "/readyz"} {
			waitOK(t, "http://127.0.0.1:"+metricsPort+path, exited, &exitErr)
		}

		// A cli tool, run by the execute stage in bubblewrap inside the
		// image, with the operator's credentials serve wrote into its data
		// directory (the image's working directory).
		data := filepath.Join(c.rootfs, "var/lib/toolgate/toolgate-data")
		jwt, err := os.ReadFile(filepath.Join(data, "busauth", "operator.jwt"))
		if err != nil {
			t.Fatalf("serve wrote no operator credentials into the working directory: %v", err)
		}
		c.env["NATS_NKEY"] = "toolgate-data/busauth/operator.nk"
		c.env["NATS_TOKEN"] = strings.TrimSpace(string(jwt))
		inv := c.command(context.Background(), "invoke", "text.word_count",
			"--nats", "nats://127.0.0.1:"+natsPort, "--params", `{"text":"one two three"}`, "--wait", "--json")
		out := command(t, inv)
		var res struct {
			Status string `json:"status"`
			Result struct {
				Words int `json:"words"`
			} `json:"result"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("invoke --json: %v\n%s", err, out)
		}
		if res.Status != "success" || res.Result.Words != 3 {
			t.Errorf("text.word_count in the image's sandbox: %s", out)
		}
	})
}

// imageConfig is the part of an OCI image configuration a runtime uses.
type imageConfig struct {
	Config struct {
		User         string
		Entrypoint   []string
		Cmd          []string
		Env          []string
		WorkingDir   string
		ExposedPorts map[string]struct{}
	} `json:"config"`
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
}

func blob(t *testing.T, layout, digest string) string {
	t.Helper()
	alg, hex, ok := strings.Cut(digest, ":")
	if !ok {
		t.Fatalf("digest %q", digest)
	}
	return filepath.Join(layout, "blobs", alg, hex)
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// readLayout reads the image tagged latest in an OCI layout: its
// configuration and its layers, base first.
func readLayout(t *testing.T, layout string) (imageConfig, []descriptor) {
	t.Helper()
	var index struct {
		Manifests []struct {
			descriptor
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	readJSON(t, filepath.Join(layout, "index.json"), &index)
	for _, m := range index.Manifests {
		if m.Annotations["org.opencontainers.image.ref.name"] != "latest" {
			continue
		}
		var manifest struct {
			Config descriptor   `json:"config"`
			Layers []descriptor `json:"layers"`
		}
		readJSON(t, blob(t, layout, m.Digest), &manifest)
		var cfg imageConfig
		readJSON(t, blob(t, layout, manifest.Config.Digest), &cfg)
		return cfg, manifest.Layers
	}
	t.Fatalf("%s: no image tagged latest", layout)
	return imageConfig{}, nil
}

// lastHeaders: each path's tar header in the topmost layer holding it.
func lastHeaders(t *testing.T, layout string, layers []descriptor) map[string]*tar.Header {
	t.Helper()
	files := map[string]*tar.Header{}
	for _, l := range layers {
		f, err := os.Open(blob(t, layout, l.Digest))
		if err != nil {
			t.Fatal(err)
		}
		var r io.Reader = f
		if strings.HasSuffix(l.MediaType, "+gzip") || strings.HasSuffix(l.MediaType, ".gzip") {
			if r, err = gzip.NewReader(f); err != nil {
				t.Fatal(err)
			}
		}
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			files[strings.TrimSuffix(strings.TrimPrefix(filepath.Clean("/"+h.Name), "/"), "/")] = h
		}
		f.Close()
	}
	return files
}

// container runs commands in an unpacked image's root file system under
// bwrap, as its configuration says: user, working directory, environment,
// entrypoint. The network is the host's, so ports are reached on loopback.
type container struct {
	rootfs     string
	uid, gid   string
	cwd        string
	env        map[string]string
	entrypoint []string
}

func newContainer(t *testing.T, rootfs string, cfg imageConfig) *container {
	t.Helper()
	uid, gid, _ := strings.Cut(cfg.Config.User, ":")
	if _, err := strconv.Atoi(uid); err != nil {
		t.Fatalf("user %q is not numeric", cfg.Config.User)
	}
	if gid == "" {
		gid = uid
	}
	c := &container{rootfs: rootfs, uid: uid, gid: gid, cwd: cfg.Config.WorkingDir, env: map[string]string{}, entrypoint: cfg.Config.Entrypoint}
	if c.cwd == "" {
		c.cwd = "/"
	}
	for _, kv := range cfg.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		c.env[k] = v
	}
	return c
}

func (c *container) exec(ctx context.Context, argv ...string) *exec.Cmd {
	// /proc is the host's, whole: the image's sandbox (bwrap again) mounts
	// a /proc of its own, which the kernel refuses under a /proc with parts
	// covered, as bwrap's own --proc and container runtimes' masked paths
	// leave it (in Kubernetes: procMount Unmasked).
	a := []string{
		"--bind", c.rootfs, "/", "--bind", "/proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
		"--unshare-user", "--uid", c.uid, "--gid", c.gid,
		"--unshare-ipc", "--unshare-uts", "--die-with-parent",
		"--clearenv", "--chdir", c.cwd,
	}
	for k, v := range c.env {
		a = append(a, "--setenv", k, v)
	}
	cmd := exec.CommandContext(ctx, "bwrap", append(append(a, "--"), argv...)...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// command runs the image's entrypoint with args.
func (c *container) command(ctx context.Context, args ...string) *exec.Cmd {
	return c.exec(ctx, append(append([]string{}, c.entrypoint...), args...)...)
}

// command runs cmd, failing the test with its output if it fails.
func command(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s%s", strings.Join(cmd.Args, " "), err, out, stderr.Bytes())
	}
	return out
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// waitOK waits until url answers 200, failing if the process ends first or
// after a minute.
func waitOK(t *testing.T, url string, exited <-chan struct{}, exitErr *error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for {
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			t.Fatalf("toolgate serve ended before %s answered: %v", url, *exitErr)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", url, last)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
