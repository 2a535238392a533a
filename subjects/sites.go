package subjects

import (
	"fmt"
	"strings"
)

// A site is a place tools run away from the hub: an execute worker whose
// NATS server is a leaf node of the hub's (docs/sites.md). Calls for a
// site's tools wait in the hub's pipeline on the site's own execute
// subjects, toolgate.pipe.execute.<priority>.<tenant>.<site>, which the
// hub's execute consumers (filter ...<priority>.*) never match.

// The operators' site endpoints of the control service: SvcSitesAdd takes
// api.SiteRequest (a site's public keys) and answers api.SiteAdded,
// SvcSitesRemove takes api.SiteRequest (its name) and answers
// api.SiteRemoved.
const (
	SvcSitesAdd    = "tool.svc.sites.add"
	SvcSitesRemove = "tool.svc.sites.remove"
)

// HubDomain is the JetStream domain of a hub that accepts sites: a site's
// worker reaches the hub's JetStream by the domain's API prefix
// (JetStream refuses the plain one across a leaf-node link).
const HubDomain = "hub"

// HubAPI is the domain form of a JetStream API subject (or of a key-value
// put, $KV.…) as a site's worker sends it to the hub.
func HubAPI(subject string) (string, bool) {
	if rest, ok := strings.CutPrefix(subject, "$JS.API."); ok {
		return "$JS." + HubDomain + ".API." + rest, true
	}
	if strings.HasPrefix(subject, "$KV.") {
		return "$JS." + HubDomain + ".API." + subject, true
	}
	return "", false
}

// MaxSiteBytes bounds a site name, which is a subject token and part of
// consumer names.
const MaxSiteBytes = 32

// CheckSite reports whether s can name a site: 1 to MaxSiteBytes bytes of
// [A-Za-z0-9_-], not starting with _ or -.
func CheckSite(s string) error {
	if s == "" || len(s) > MaxSiteBytes {
		return fmt.Errorf("%w: site must be 1 to %d bytes, got %d", ErrBadName, MaxSiteBytes, len(s))
	}
	for i := 0; i < len(s); i++ {
		if !isPlain(s[i]) {
			return fmt.Errorf("%w: site may hold only [A-Za-z0-9_-], found %q", ErrBadName, s[i])
		}
	}
	if s[0] == '_' || s[0] == '-' {
		return fmt.Errorf("%w: site %q must start with a letter or digit", ErrBadName, s)
	}
	return nil
}

// PipeSite is the subject on which execute at site receives invocations of
// tenant at a priority.
func PipeSite(site, priority, tenant string) string {
	return Pipe(Execute, priority, tenant) + "." + site
}

// PipeSiteAll matches every call waiting for site, at any priority and
// tenant.
func PipeSiteAll(site string) string { return pipePrefix + Execute + ".*.*." + site }

// SiteOfPipe returns the site a hand-off subject is addressed to, if any.
func SiteOfPipe(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, pipePrefix)
	if !ok {
		return "", false
	}
	// execute.priority.tenant.site; cut, not split: every hop's signing
	// asks.
	stage, rest, _ := strings.Cut(rest, ".")
	_, rest, ok1 := strings.Cut(rest, ".")
	_, site, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || stage != Execute || site == "" || strings.Contains(site, ".") {
		return "", false
	}
	return site, true
}

// SiteInputs are the durable consumers of site's execute worker, highest
// priority first.
func SiteInputs(site string) []Input {
	out := make([]Input, 0, len(Priorities))
	for _, p := range Priorities {
		out = append(out, Input{Stream: StreamPipeline, Consumer: SiteConsumer(site, p), Filter: pipePrefix + Execute + "." + p + ".*." + site})
	}
	return out
}

// SiteConsumer is the name of site's durable consumer at priority.
func SiteConsumer(site, priority string) string { return "site-" + site + "-" + priority }

// SiteInbox is the inbox prefix of site's connections: what its leaf may
// subscribe below, and no other site's.
func SiteInbox(site string) string { return "_INBOX.site." + site }

// A site's outbox: what its worker hands on (to verify, to audit) and
// relays goes to the hub on subjects of its own, toolgate.site.<site>.
// <subject>, held in a stream of its own (StreamSite) with bounds of its
// own, so that a site flooding it fills only its own. The hub forwards each
// message its site signed, at a bounded rate, to <subject>.
const siteOutPrefix = "toolgate.site."

// SiteOutbox is every subject of site's outbox.
func SiteOutbox(site string) string { return siteOutPrefix + site + ".>" }

// SiteOut is the subject of site's outbox that carries subject.
func SiteOut(site, subject string) string { return siteOutPrefix + site + "." + subject }

// FromSiteOut is the subject a message of site's outbox is for, if it is
// one a site may send (Outboxed).
func FromSiteOut(site, subject string) (string, bool) {
	to, ok := strings.CutPrefix(subject, siteOutPrefix+site+".")
	return to, ok && Outboxed(to)
}

// Outboxed reports whether a site sends subject through its outbox: its
// hand-offs and what it relays.
func Outboxed(subject string) bool {
	return strings.HasPrefix(subject, pipePrefix) || strings.HasPrefix(subject, relayPrefix)
}

// StreamSite is the stream of site's outbox.
func StreamSite(site string) string { return "TOOLGATE_SITE_" + site }

// SiteForward is the hub's consumer of a site's outbox stream.
func SiteForward(site string) Input {
	return Input{Stream: StreamSite(site), Consumer: "forward", Filter: SiteOutbox(site)}
}
