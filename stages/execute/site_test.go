package execute

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
)

// TestSiteOverdue: a call that waited for its site past route's deadline,
// or past its authorization's expiry, ends E3271 naming the site; one in
// time, or a hub call, runs.
func TestSiteOverdue(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name  string
		route *envelope.Route
		exp   time.Time
		want  bool
	}{
		{"hub call", &envelope.Route{ToolID: "t"}, now.Add(-time.Hour), false},
		{"in time", &envelope.Route{Site: "lab-eu", SiteDeadline: now.Add(time.Minute)}, now.Add(time.Hour), false},
		{"past route's deadline", &envelope.Route{Site: "lab-eu", SiteDeadline: now.Add(-time.Second)}, now.Add(time.Hour), true},
		{"past the token's expiry", &envelope.Route{Site: "lab-eu", SiteDeadline: now.Add(time.Hour)}, now.Add(-time.Second), true},
	}
	for _, c := range cases {
		inv := &envelope.Invocation{Route: c.route, Authz: &envelope.Authorization{Seal: &envelope.Seal{Expires: c.exp.UnixMilli()}}}
		err := siteOverdue(inv, now)
		if (err != nil) != c.want {
			t.Fatalf("%s: %v, want overdue %v", c.name, err, c.want)
		}
		if c.want && (!errors.Is(err, &api.Error{Code: api.Timeout, ECode: api.ESiteTimeout}) || err.(*api.Error).Details["site"] != "lab-eu") {
			t.Fatalf("%s: %v, want E3271 naming lab-eu", c.name, err)
		}
	}
}

// TestSiteScrub: at a site, a secret in a result is redacted before the
// result leaves, and recorded as a finding; elsewhere execute leaves the
// result to verify.
func TestSiteScrub(t *testing.T) {
	doc := []byte(`{"log":"key AKIAQ4NB7XWZ3RTK2M5H in a log line","n":1}`)
	inv := &envelope.Invocation{}
	out := (&Executor{SiteScrub: detect.Default()}).scrub(inv, doc)
	if strings.Contains(string(out), "AKIAQ4NB7XWZ3RTK2M5H") || !strings.Contains(string(out), "[REDACTED:") {
		t.Fatalf("a site's result left as %s", out)
	}
	if len(inv.Findings) != 1 || inv.Findings[0].Action != "redact" || inv.Findings[0].Path != "/log" {
		t.Fatalf("findings %+v", inv.Findings)
	}
	if out := (&Executor{}).scrub(&envelope.Invocation{}, doc); string(out) != string(doc) {
		t.Fatalf("the hub's execute changed a result: %s", out)
	}
}
