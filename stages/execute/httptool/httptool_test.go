package httptool

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const secretValue = "s3cr3t-V@lue/with+chars"

type staticSecrets map[string]string

func (s staticSecrets) Lookup(name string) (string, error) {
	if v, ok := s[name]; ok {
		return v, nil
	}
	return "", errors.New("not found")
}

// manifest parses an http tool manifest with the given http object and
// permissions, so every test manifest also passes the manifest schema.
func manifest(t *testing.T, httpSpec string, perms string) *tools.Manifest {
	t.Helper()
	if perms == "" {
		perms = `{}`
	}
	doc := fmt.Sprintf(`{"id":"test.http","name":"t","version":"1.0.0","description":"d","kind":"http","http":%s,
		"input_schema":{"type":"object"},"permissions":%s}`, httpSpec, perms)
	m, err := tools.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("manifest: %v %+v", err, api.AsError(err).Fields)
	}
	return m
}

func grants(hosts []string, ports []int, secrets ...string) *envelope.Invocation {
	return &envelope.Invocation{Authz: &envelope.Authorization{Grants: envelope.Grants{Hosts: hosts, Ports: ports, Secrets: secrets}}}
}

// local grants 127.0.0.1 on any port.
var local = grants([]string{"127.0.0.1"}, nil, "api_key")

func run(t *testing.T, k *Kind, m *tools.Manifest, inv *envelope.Invocation, params string) (map[string]any, error) {
	t.Helper()
	fn, err := k.Prepare(m, inv)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := fn(ctx, json.RawMessage(params))
	if err != nil {
		return nil, err
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("result %s: %v", out, err)
	}
	return res, nil
}

func wantCode(t *testing.T, err error, code api.Code, ecode string) *api.Error {
	t.Helper()
	var te *api.Error
	if !errors.As(err, &te) || te.Code != code || te.ECode != ecode {
		t.Fatalf("error %v, want %s/%s", err, code, ecode)
	}
	return te
}

func TestURLTemplateKeepsParametersInPlace(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.RequestURI)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer srv.Close()
	k := New(Config{})
	defer k.Close()
	m := manifest(t, `{"url":"`+srv.URL+`/items/{{id}}/x?q={{q}}&n={{n}}"}`, "")
	res, err := run(t, k, m, local, `{"id":"a/../../x?y=1#z","q":"a&b=c#d e","n":5}`)
	if err != nil {
		t.Fatal(err)
	}
	uri := got.Load().(string)
	u, _ := url.Parse(uri)
	if u.EscapedPath() != "/items/a%2F..%2F..%2Fx%3Fy=1%23z/x" {
		t.Errorf("path %q: the parameter left its segment", u.EscapedPath())
	}
	if q := u.Query(); q.Get("q") != "a&b=c#d e" || q.Get("n") != "5" || len(q) != 2 {
		t.Errorf("query %q: the parameter left its value", u.RawQuery)
	}
	if res["status"].(float64) != 200 || res["body"].(map[string]any)["ok"] != true {
		t.Errorf("result %v", res)
	}
	// A value that is a dot segment is refused before anything is sent.
	_, err = run(t, k, m, local, `{"id":"..","q":"","n":1}`)
	if te := wantCode(t, err, api.InvalidParameters, api.EParametersInvalid); te.Details["not_started"] != true {
		t.Errorf("not_started missing: %+v", te)
	}
}

func TestPlaceholdersCannotReachTheHost(t *testing.T) {
	k := New(Config{})
	for _, u := range []string{"http://{{host}}/x", "http://api.example.com{{x}}/", "http://127.0.0.1:{{port}}/",
		"{{scheme}}://api.example.com/", "https://api.example.com/#{{frag}}", "ftp://api.example.com/", "https://user:pw@api.example.com/"} {
		m := manifest(t, `{"url":"`+u+`"}`, "")
		_, err := k.Prepare(m, local)
		wantCode(t, err, api.ToolExecutionError, api.EExecutorUnavailable)
	}
}

func TestAllowlist(t *testing.T) {
	cases := []struct {
		declared string
		hosts    []string
		ports    []int
		url      string
		ok       bool
	}{
		{`[]`, []string{"api.example.com"}, nil, "https://api.example.com/x", true},
		{`[]`, []string{"*.example.com"}, []int{443}, "https://api.example.com/x", true},
		{`[]`, []string{"*.example.com"}, []int{443}, "http://api.example.com/x", false}, // port 80
		{`[]`, []string{"api.example.com"}, nil, "https://evil.com/x", false},
		{`[]`, nil, nil, "https://api.example.com/x", false}, // the token grants no host
		{`[{"host":"api.example.com","port":443}]`, []string{"*.example.com"}, nil, "https://api.example.com/", true},
		{`[{"host":"api.example.com","port":443}]`, []string{"*.example.com"}, nil, "https://api.example.com:8443/", false},
		{`[{"host":"api.example.com"}]`, []string{"*.example.com"}, nil, "https://other.example.com/", false}, // not declared
		{`[{"host":"*.example.com"}]`, []string{"api.example.com"}, nil, "https://other.example.com/", false}, // not granted
		{`[]`, []string{"api.example.com"}, nil, "https://API.Example.com/", true},
		{`[]`, []string{"example.com"}, nil, "https://example.com.evil.net/", false},
	}
	for _, c := range cases {
		m := manifest(t, `{"url":"{{url}}"}`, `{"network":`+c.declared+`}`)
		u, _ := url.Parse(c.url)
		err := newAllowlist(m, envelope.Grants{Hosts: c.hosts, Ports: c.ports}).check(u)
		if (err == nil) != c.ok {
			t.Errorf("%s declared %s granted %v %v: %v, want ok = %v", c.url, c.declared, c.hosts, c.ports, err, c.ok)
		}
		if err != nil {
			wantCode(t, err, api.PermissionDenied, api.ENetworkPolicy)
		}
	}
}

func TestRequestToHostNotGrantedIsRefused(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer srv.Close()
	k := New(Config{})
	m := manifest(t, `{"url":"{{url}}"}`, "")
	_, err := run(t, k, m, grants([]string{"localhost"}, nil), `{"url":"`+srv.URL+`"}`)
	if te := wantCode(t, err, api.PermissionDenied, api.ENetworkPolicy); te.Details["not_started"] != true {
		t.Errorf("not_started missing: %+v", te)
	}
	if hits.Load() != 0 {
		t.Fatal("the request was sent")
	}
}

func TestRedirects(t *testing.T) {
	var offHits atomic.Int32
	var sawKey atomic.Value
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		offHits.Add(1)
		sawKey.Store(r.Header.Get("X-Api-Key"))
		_, _ = io.WriteString(w, "landed")
	}))
	defer target.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(target.URL, "http://"))
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	}))
	defer src.Close()
	k := New(Config{Secrets: staticSecrets{"api_key": secretValue}})
	m := manifest(t, `{"url":"`+src.URL+`/?to={{to}}","credentials":[{"secret":"api_key","header":"X-Api-Key"}]}`,
		`{"network":[{"host":"127.0.0.1"}],"credentials":["api_key"]}`)
	// Off the allowlist: localhost is another host name.
	_, err := run(t, k, m, local, `{"to":"http://localhost:`+port+`/"}`)
	te := wantCode(t, err, api.PermissionDenied, api.ENetworkPolicy)
	if te.Details["redirect"] != true || offHits.Load() != 0 {
		t.Fatalf("redirect off the allowlist: %+v, %d hits", te, offHits.Load())
	}
	// Within it, to another port: followed, without the credential.
	res, err := run(t, k, m, local, `{"to":"`+target.URL+`/"}`)
	if err != nil {
		t.Fatal(err)
	}
	if res["body"] != "landed" || sawKey.Load() != "" {
		t.Fatalf("result %v, credential forwarded: %q", res, sawKey.Load())
	}
}

func TestErrorStatuses(t *testing.T) {
	date := time.Now().Add(3 * time.Second).UTC().Format(http.TimeFormat)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/429":
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
		case "/503":
			w.Header().Set("Retry-After", date)
			w.WriteHeader(503)
		case "/500":
			w.WriteHeader(500)
		case "/404":
			w.WriteHeader(404)
		case "/401":
			w.WriteHeader(401)
		}
	}))
	defer srv.Close()
	k := New(Config{})
	m := manifest(t, `{"url":"`+srv.URL+`/{{s}}"}`, "")
	cases := []struct {
		s         string
		code      api.Code
		ecode     string
		retryable bool
		after     [2]float64 // retry_after_ms bounds; zero: absent
	}{
		{"429", api.RateLimitExceeded, api.ERateLimited, true, [2]float64{2000, 2000}},
		{"503", api.ExternalAPIError, api.EExternalStatus, true, [2]float64{1000, 3000}},
		{"500", api.ExternalAPIError, api.EExternalStatus, true, [2]float64{}},
		{"404", api.ExternalAPIError, api.EExternalStatus, false, [2]float64{}},
		{"401", api.ExternalAPIError, api.EExternalAuth, false, [2]float64{}},
	}
	for _, c := range cases {
		_, err := run(t, k, m, local, `{"s":"`+c.s+`"}`)
		te := wantCode(t, err, c.code, c.ecode)
		if te.Retryable != c.retryable || fmt.Sprint(te.Details["status"]) != c.s {
			t.Errorf("%s: %+v", c.s, te)
		}
		ms, ok := te.Details["retry_after_ms"].(int64)
		if c.after[1] == 0 && ok || c.after[1] > 0 && (!ok || float64(ms) < c.after[0] || float64(ms) > c.after[1]) {
			t.Errorf("%s: retry_after_ms = %v, want within %v", c.s, te.Details["retry_after_ms"], c.after)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]int64{"0": 0, "7": 7000, now.Add(90 * time.Second).Format(http.TimeFormat): 90000,
		now.Add(-time.Hour).Format(http.TimeFormat): 0, "99999999999999": 24 * 3600 * 1000} {
		if got, ok := retryAfter(v, now); !ok || got != want {
			t.Errorf("retryAfter(%q) = %d, %v; want %d", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "-1", "soon"} {
		if _, ok := retryAfter(v, now); ok {
			t.Errorf("retryAfter(%q) accepted", v)
		}
	}
}

func TestResponseSizeCap(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := len(r.URL.Query().Get("n"))
		if r.URL.Query().Get("chunked") != "" {
			w.(http.Flusher).Flush() // no Content-Length: the cap must hold while reading
		}
		_, _ = io.WriteString(w, strings.Repeat("x", n))
	}))
	defer srv.Close()
	k := New(Config{})
	m := manifest(t, `{"url":"`+srv.URL+`/?n={{n}}&chunked={{c}}","max_response_bytes":100,"response":"text"}`, "")
	if res, err := run(t, k, m, local, `{"n":"`+strings.Repeat("a", 100)+`"}`); err != nil || len(res["body"].(string)) != 100 {
		t.Fatalf("at the cap: %v %v", res, err)
	}
	for _, c := range []string{"", "1"} {
		_, err := run(t, k, m, local, `{"n":"`+strings.Repeat("a", 101)+`","c":"`+c+`"}`)
		wantCode(t, err, api.ResourceExhausted, api.EResourceLimit)
	}
}

func TestCredentialInjectedAndScrubbed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		if auth != "Bearer "+secretValue {
			w.WriteHeader(401)
			return
		}
		w.Header().Set("X-Echo", auth)
		w.Header().Set("Content-Type", "application/json")
		v := strings.TrimPrefix(auth, "Bearer ")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"auth": auth, "b64": base64.StdEncoding.EncodeToString([]byte(v)), "escaped": url.QueryEscape(v),
			v: "as a key", "nested": []any{"x" + v + "y"},
		})
	}))
	defer srv.Close()
	k := New(Config{Secrets: staticSecrets{"api_key": secretValue}})
	m := manifest(t, `{"url":"`+srv.URL+`/","credentials":[{"secret":"api_key","header":"Authorization","prefix":"Bearer "}],
		"response_headers":["x-echo"]}`, `{"credentials":["api_key"]}`)
	fn, err := k.Prepare(m, local)
	if err != nil {
		t.Fatal(err)
	}
	out, err := fn(context.Background(), json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []string{secretValue, base64.StdEncoding.EncodeToString([]byte(secretValue)), url.QueryEscape(secretValue), "s3cr3t"} {
		if strings.Contains(string(out), form) {
			t.Fatalf("result holds the secret (%q): %s", form, out)
		}
	}
	if !strings.Contains(string(out), `"x-echo":"[REDACTED]"`) || !strings.Contains(string(out), `"auth":"[REDACTED]"`) {
		t.Fatalf("result %s", out)
	}
	// Not granted by the token, or held by no source: refused before sending.
	_, err = k.Prepare(m, grants([]string{"127.0.0.1"}, nil))
	wantCode(t, err, api.PermissionDenied, api.ECredentialDenied)
	_, err = New(Config{Secrets: staticSecrets{}}).Prepare(m, local)
	wantCode(t, err, api.ToolExecutionError, api.ECredentialUnavailable)
	// A credential the manifest does not declare is a configuration error.
	undeclared := manifest(t, `{"url":"`+srv.URL+`/","credentials":[{"secret":"api_key","header":"Authorization"}]}`, "")
	_, err = k.Prepare(undeclared, local)
	wantCode(t, err, api.ToolExecutionError, api.EExecutorUnavailable)
}

func TestBodyTemplates(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.Store(r.Method + " " + r.Header.Get("Content-Type") + " " + r.Header.Get("X-Trace") + " " + string(b))
		w.WriteHeader(201)
	}))
	defer srv.Close()
	k := New(Config{})
	m := manifest(t, `{"method":"POST","url":"`+srv.URL+`/","headers":{"X-Trace":"t-{{n}}"},
		"body":{"q":"{{q}}","n":"{{n}}","opt":"{{missing}}","s":"id-{{n}}","list":["{{q}}","{{missing}}"]}}`, "")
	res, err := run(t, k, m, local, `{"q":{"deep":[1,2]},"n":5}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `POST application/json t-5 {"list":[{"deep":[1,2]},null],"n":5,"q":{"deep":[1,2]},"s":"id-5"}`
	if got.Load() != want || res["status"].(float64) != 201 || res["body"] != nil {
		t.Fatalf("sent %q, result %v; want %q", got.Load(), res, want)
	}
	m = manifest(t, `{"method":"PUT","url":"`+srv.URL+`/","body_from_parameters":true}`, "")
	if _, err := run(t, k, m, local, `{"a":1}`); err != nil || got.Load() != `PUT application/json  {"a":1}` {
		t.Fatalf("sent %q: %v", got.Load(), err)
	}
	// A header value cannot be split by a parameter.
	m = manifest(t, `{"url":"`+srv.URL+`/","headers":{"X-Trace":"{{n}}"}}`, "")
	_, err = run(t, k, m, local, `{"n":"a\r\nX-Evil: 1"}`)
	wantCode(t, err, api.InvalidParameters, api.EParametersInvalid)
}

func TestResponseFormats(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/json":
			w.Header().Set("Content-Type", "application/problem+json")
			_, _ = io.WriteString(w, `{"big":12345678901234567890}`)
		case "/badjson":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"a":`)
		case "/bin":
			_, _ = w.Write([]byte{0xff, 0xfe, 0})
		}
	}))
	defer srv.Close()
	k := New(Config{})
	fn, err := k.Prepare(manifest(t, `{"url":"`+srv.URL+`/{{p}}"}`, ""), local)
	if err != nil {
		t.Fatal(err)
	}
	out, err := fn(context.Background(), json.RawMessage(`{"p":"json"}`))
	if err != nil || !strings.Contains(string(out), `"body":{"big":12345678901234567890}`) {
		t.Fatalf("json: %s %v", out, err)
	}
	out, err = fn(context.Background(), json.RawMessage(`{"p":"badjson"}`))
	if err != nil || !strings.Contains(string(out), `"body":"{\"a\":"`) {
		t.Fatalf("auto falls back to text: %s %v", out, err)
	}
	out, err = fn(context.Background(), json.RawMessage(`{"p":"bin"}`))
	if err != nil || !strings.Contains(string(out), `"body":"//4A","body_encoding":"base64"`) {
		t.Fatalf("bytes: %s %v", out, err)
	}
	strict, err := k.Prepare(manifest(t, `{"url":"`+srv.URL+`/{{p}}","response":"json"}`, ""), local)
	if err != nil {
		t.Fatal(err)
	}
	_, err = strict(context.Background(), json.RawMessage(`{"p":"badjson"}`))
	wantCode(t, err, api.ExternalAPIError, api.EExternalMalformed)
}

func TestUnreachableIsRetryableAndNotStarted(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	k := New(Config{})
	_, err = run(t, k, manifest(t, `{"url":"http://`+addr+`/"}`, ""), local, `{}`)
	te := wantCode(t, err, api.ExternalAPIError, api.EExternalUnreachable)
	if !te.Retryable || te.Details["not_started"] != true {
		t.Fatalf("%+v", te)
	}
}

func TestTimeoutIsTheContexts(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer srv.Close()
	fn, err := New(Config{}).Prepare(manifest(t, `{"url":"`+srv.URL+`/"}`, ""), local)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := fn(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v, want the context's deadline", err)
	}
}

func TestTarget(t *testing.T) {
	m := manifest(t, `{"url":"{{url}}"}`, "")
	if h, p, ok := Target(m, json.RawMessage(`{"url":"https://API.example.com/x"}`)); !ok || h != "api.example.com" || p != 443 {
		t.Fatalf("Target = %s %d %v", h, p, ok)
	}
	m = manifest(t, `{"url":"http://127.0.0.1:8080/{{id}}"}`, "")
	if h, p, ok := Target(m, json.RawMessage(`{"id":"x"}`)); !ok || h != "127.0.0.1" || p != 8080 {
		t.Fatalf("Target = %s %d %v", h, p, ok)
	}
	if _, _, ok := Target(m, json.RawMessage(`[]`)); ok {
		t.Fatal("Target of bad parameters")
	}
}

// TestGrantedNameResolvingPrivately: a granted host name that resolves to a
// loopback address (DNS rebinding, or a name for the host's own services)
// is refused before anything is sent, unless the operator allows private
// networks; an IP literal granted as such still works.
func TestGrantedNameResolvingPrivately(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	byName := manifest(t, `{"url":"http://localhost:`+port+`/"}`, "")
	byLiteral := manifest(t, `{"url":"`+srv.URL+`/"}`, "")
	inv := grants([]string{"localhost", "127.0.0.1"}, nil)

	k := New(Config{})
	defer k.Close()
	_, err := run(t, k, byName, inv, `{}`)
	if te := wantCode(t, err, api.PermissionDenied, api.ENetworkPolicy); te.Details["not_started"] != true || hits.Load() != 0 {
		t.Fatalf("refusal %+v, %d requests reached the server", te, hits.Load())
	}
	if _, err := run(t, k, byLiteral, inv, `{}`); err != nil {
		t.Fatalf("a granted IP literal: %v", err)
	}
	open := New(Config{AllowPrivateNetworks: true})
	defer open.Close()
	if _, err := run(t, open, byName, inv, `{}`); err != nil {
		t.Fatalf("with private networks allowed: %v", err)
	}
	if hits.Load() != 2 {
		t.Fatalf("%d requests reached the server, want 2", hits.Load())
	}
}

func TestPublicAddresses(t *testing.T) {
	for addr, want := range map[string]bool{
		"93.184.215.14": true, "2606:2800:21f:cb07:6820:80da:af6b:8b2c": true,
		"127.0.0.1": false, "::1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false,
		"169.254.169.254": false, "fe80::1": false, "100.64.0.1": false, "0.0.0.0": false, "::ffff:127.0.0.1": false,
		"fd00::1": false, "224.0.0.1": false,
	} {
		if got := public(netip.MustParseAddr(addr)); got != want {
			t.Errorf("public(%s) = %v, want %v", addr, got, want)
		}
	}
}
