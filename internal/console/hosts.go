package console

import (
	"cmp"
	"net"
	"net/http"
	"strings"
)

// hostName is a name the console answers to; port "" is any port.
type hostName struct{ host, port string }

// parseHost reads "host", "host:port", "[v6]" or "[v6]:port" (a bare IPv6
// address too), lower-cased, without a trailing dot, IP addresses in their
// canonical form.
func parseHost(s string) (hostName, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	var n hostName
	if h, p, err := net.SplitHostPort(s); err == nil {
		n.host, n.port = h, p
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		n.host = s[1 : len(s)-1]
	} else if strings.Count(s, ":") > 1 || !strings.Contains(s, ":") {
		n.host = s
	} else {
		return n, false
	}
	n.host = strings.TrimSuffix(n.host, ".")
	if ip := net.ParseIP(n.host); ip != nil {
		n.host = ip.String()
	}
	for _, c := range n.port {
		if c < '0' || c > '9' {
			return n, false
		}
	}
	return n, n.host != "" && !strings.ContainsAny(n.host, "/@?#[] ")
}

// AllowListen makes the console answer to the names of addr (host:port),
// the address it is served on: that host and port and, on a loopback
// address, localhost, 127.0.0.1 and [::1] with that port. Serve calls it
// with its listener's address; whoever serves Handler otherwise calls it
// with theirs.
func (s *Server) AllowListen(addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return
	}
	names := []string{host}
	if Loopback(addr) {
		names = append(names, "localhost", "127.0.0.1", "::1")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range names {
		if n, ok := parseHost(net.JoinHostPort(h, port)); ok {
			s.hosts = append(s.hosts, n)
		}
	}
}

// answers reports whether host (a Host header or an Origin's host) names
// the console. Without a port it is the scheme's default.
func (s *Server) answers(host string, tls bool) bool {
	n, ok := parseHost(host)
	if !ok {
		return false
	}
	if n.port == "" {
		n.port = "80"
		if tls {
			n.port = "443"
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.hosts {
		if h.host == n.host && (h.port == "" || h.port == n.port) {
			return true
		}
	}
	return false
}

// hostAllowed refuses, before anything else, a request whose Host is not
// one of the console's names: a page of another site whose name was made
// to point at the console would otherwise be the console's own origin in
// the browser, cookie and all.
func (s *Server) hostAllowed(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.answers(r.Host, r.TLS != nil) {
			http.Error(w, "refused: this console does not answer to the Host this request names; "+
				"open it at the address it printed, or start it with --allow-host for this name", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Unspecified reports whether addr (host:port) listens on every address
// of the machine (0.0.0.0, ::, or no host): no name a browser opens.
func Unspecified(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// LinkHost is the host:port the console's login links name when it
// listens on addr: addr itself, or, listening on every address, the
// first allowed name with addr's port unless it gives its own.
func LinkHost(addr string, allow []string) string {
	if !Unspecified(addr) || len(allow) == 0 {
		return addr
	}
	_, port, _ := net.SplitHostPort(addr)
	n, ok := parseHost(allow[0])
	if !ok {
		return addr
	}
	return net.JoinHostPort(n.host, cmp.Or(n.port, port))
}
