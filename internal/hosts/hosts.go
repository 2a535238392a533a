// Package hosts is the one host allowlist match: capability tokens' granted
// hosts, manifests' declared network permissions and executors' checks all
// use it.
package hosts

import (
	"slices"
	"strings"
)

// Match reports whether host matches pattern, ignoring case: equal, or
// pattern "*.example.com" and host a subdomain of example.com (not
// example.com itself).
func Match(pattern, host string) bool {
	pattern, host = strings.ToLower(pattern), strings.ToLower(host)
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(host, "."+suffix)
	}
	return pattern == host
}

// Any reports whether host matches one of patterns.
func Any(patterns []string, host string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return Match(p, host) })
}
