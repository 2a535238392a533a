// Package console is toolgate's web console for the people who approve and
// watch: the approvals inbox, one invocation's story, the live audit trail
// and an overview. It talks to toolgate only through the client package, as
// an operator, and keeps no state but its sign-in sessions and a window of
// recent audit events it can read again from the bus.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/toolgate/toolgate/client"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Config is what a console needs.
type Config struct {
	// Client is connected with operator credentials.
	Client *client.Client
	// Sign signs decisions as the operator (nil on a bus without
	// authentication).
	Sign client.Sign
	// By names the decider on a bus without authentication; an
	// authenticated bus records the signing operator instead.
	By string
	// Tenants are listed in the inbox even before the audit trail names
	// them.
	Tenants []string
	// Backlog is how many stored audit events the console reads at start
	// (default 2000), and Window how many recent ones it keeps (default
	// 5000).
	Backlog, Window int
	// SessionTTL bounds a session (default 12 h).
	SessionTTL time.Duration
	// OnLink is called with the path and query of each new one-time login
	// link (/login?token=…): at start and whenever the previous was used.
	OnLink func(path string)
	// Now is the clock (default time.Now).
	Now func() time.Time
	// AllowHosts are the names the console answers to besides those of
	// the address it listens on (see AllowListen): "host" (any port) or
	// "host:port". A request naming another Host is refused, so a page of
	// another site cannot reach the console through a name it controls
	// (DNS rebinding).
	AllowHosts []string
}

// Server is a console.
type Server struct {
	cfg   Config
	tmpl  *template.Template
	audit *hub

	mu       sync.Mutex
	link     string // the one-time login token not yet used
	sessions map[string]session
	tenants  map[string]bool
	hosts    []hostName // the names the console answers to
}

type session struct {
	csrf    string
	expires time.Time
}

const cookieName = "toolgate_console"

// New returns a console; Run feeds it the audit trail.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("console: no client")
	}
	if cfg.Backlog == 0 {
		cfg.Backlog = 2000
	}
	if cfg.Window == 0 {
		cfg.Window = 5000
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tmpl: t, audit: newHub(cfg.Window), sessions: map[string]session{}, tenants: map[string]bool{}}
	for _, t := range cfg.Tenants {
		s.tenants[t] = true
	}
	for _, h := range cfg.AllowHosts {
		n, ok := parseHost(h)
		if !ok {
			return nil, fmt.Errorf("console: allowed host %q: want host or host:port", h)
		}
		s.hosts = append(s.hosts, n)
	}
	s.newLink()
	return s, nil
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// newLink makes the next one-time login link and tells OnLink.
func (s *Server) newLink() {
	s.mu.Lock()
	s.link = randomToken()
	p := "/login?token=" + url.QueryEscape(s.link)
	s.mu.Unlock()
	if s.cfg.OnLink != nil {
		s.cfg.OnLink(p)
	}
}

// Handler serves the console.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	assets, _ := fs.Sub(assetFS, "assets")
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	mux.HandleFunc("GET /login", s.login)
	mux.HandleFunc("GET /{$}", s.signedIn(s.inbox))
	mux.HandleFunc("GET /approvals", s.signedIn(s.inboxList))
	mux.HandleFunc("POST /approvals/{tenant}/{id}", s.signedIn(s.decide))
	mux.HandleFunc("GET /invocations/{tenant}/{id}", s.signedIn(s.invocation))
	// The same with ?tenant=…&id=…, for a call no path segment can name
	// (callPath).
	mux.HandleFunc("POST /approvals", s.signedIn(s.decide))
	mux.HandleFunc("GET /invocations", s.signedIn(s.invocation))
	mux.HandleFunc("GET /audit", s.signedIn(s.auditPage))
	mux.HandleFunc("GET /audit/stream", s.signedIn(s.auditStream))
	mux.HandleFunc("GET /audit/event/{seq}", s.signedIn(s.auditEvent))
	mux.HandleFunc("GET /overview", s.signedIn(s.overview))
	mux.HandleFunc("POST /logout", s.signedIn(s.logout))
	return secure(s.hostAllowed(mux))
}

// csp allows nothing but the console's own scripts, styles and images:
// no inline script or style, no framing, forms only to itself.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

func secure(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		// same-origin, not no-referrer: under no-referrer a browser sends
		// "Origin: null" on its own form posts, which the Origin check refuses.
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// login trades the one-time token for a session; the token is spent
// either way it is presented right, and the next one is printed.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	tok := r.URL.Query().Get("token")
	s.mu.Lock()
	ok := tok != "" && s.link != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(s.link)) == 1
	if ok {
		s.link = ""
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "this login link is not valid (it may have been used already): use the newest link the console printed", http.StatusForbidden)
		return
	}
	s.newLink()
	id := randomToken()
	now := s.cfg.Now()
	s.mu.Lock()
	for k, v := range s.sessions {
		if now.After(v.expires) {
			delete(s.sessions, k)
		}
	}
	s.sessions[id] = session{csrf: randomToken(), expires: now.Add(s.cfg.SessionTTL)}
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int(s.cfg.SessionTTL.Seconds())})
	// Away from the address bar's copy of the spent token.
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

type ctxKey struct{}

// signedIn serves h only in a session; a POST also needs the session's
// CSRF token and a request from the console's own origin.
func (s *Server) signedIn(h func(http.ResponseWriter, *http.Request, session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := r.Cookie(cookieName)
		var sess session
		ok := false
		if err == nil {
			s.mu.Lock()
			sess, ok = s.sessions[c.Value]
			if ok && s.cfg.Now().After(sess.expires) {
				delete(s.sessions, c.Value)
				ok = false
			}
			s.mu.Unlock()
		}
		if !ok {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte("sign in with the login link the console printed\n"))
			return
		}
		if r.Method == http.MethodPost {
			if !s.sameOrigin(r) {
				http.Error(w, "refused: the request does not come from this console's own pages (Origin)", http.StatusForbidden)
				return
			}
			if got := r.PostFormValue("csrf"); got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) != 1 {
				http.Error(w, "refused: the form's CSRF token is missing or wrong; reload the page", http.StatusForbidden)
				return
			}
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, c.Value)), sess)
	}
}

// sameOrigin reports whether a state change comes from the console's own
// pages: the Origin a browser sends must name one of the console's hosts,
// not merely the Host the request claims. A request without Origin is
// refused, too: every browser sends it on a POST.
func (s *Server) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && u.User == nil && u.Path == "" && u.RawQuery == "" && s.answers(u.Host, r.TLS != nil)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, _ session) {
	if id, ok := r.Context().Value(ctxKey{}).(string); ok {
		s.mu.Lock()
		delete(s.sessions, id)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("signed out\n"))
}

// Loopback reports whether addr (host:port) listens only on this machine.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Serve serves the console on ln (HTTPS when certFile and keyFile are
// given), answering to ln's address and Config.AllowHosts, and follows
// the audit trail, until ctx ends.
func (s *Server) Serve(ctx context.Context, ln net.Listener, certFile, keyFile string) error {
	s.AllowListen(ln.Addr().String())
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 2)
	go func() { errc <- s.Run(ctx) }()
	go func() {
		if certFile != "" {
			errc <- hs.ServeTLS(ln, certFile, keyFile)
		} else {
			errc <- hs.Serve(ln)
		}
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopped := ctx.Err() != nil
	// Ending ctx ends the live streams, so Shutdown need not wait for them.
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = hs.Shutdown(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) && !stopped {
		return err
	}
	return nil
}
