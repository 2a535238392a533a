package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/internal/busauth"
)

// The hub's server refuses what a site's leaf link asks outside the site's
// grant (a subscription or a publish) by closing the link, and says so only
// in its log: leafRefusals reads that log line and audits it as the bus's
// refusal (bus.refused), as a refused connection is. Only a leaf link's
// violations are audited this way: the server closes the link on each one,
// and the site redials no sooner than 30 seconds later, which bounds the
// events a site can make. A client's refusals, which close nothing, are
// read by clientRefusals, which bounds them itself.
type leafRefusals struct {
	inner   server.Logger // the server's own log, or nil
	auditor *refusalAuditor
	clients *clientRefusals // an admitted client's refusals; nil: not read
}

// leafViolation marks the server's log line of a leaf link's violation
// (nats-server's leafPermViolation).
const leafViolation = " Violation on "

func (l *leafRefusals) Errorf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Errorf(format, v...)
	}
	line := fmt.Sprintf(format, v...)
	if l.clients != nil {
		l.clients.logged(line)
	}
	if !strings.Contains(line, leafViolation) || !strings.Contains(line, "Check other side configuration") {
		return
	}
	r := busauth.Refusal{Time: time.Now(), Role: busauth.RoleSite, Err: errors.New("leaf link refused: " + line)}
	if i := strings.Index(line, `"toolgate-site-`); i >= 0 {
		name := line[i+len(`"toolgate-site-`):]
		if j := strings.IndexByte(name, '"'); j >= 0 {
			r.Name = name[:j]
		}
	}
	// Not in the server's goroutine: it holds locks while it logs.
	go l.auditor.Refused(context.Background(), r)
}

func (l *leafRefusals) Noticef(format string, v ...any) {
	if l.inner != nil {
		l.inner.Noticef(format, v...)
	}
}

func (l *leafRefusals) Warnf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Warnf(format, v...)
	}
}

func (l *leafRefusals) Fatalf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Fatalf(format, v...)
	}
}

func (l *leafRefusals) Debugf(format string, v ...any) {
	if l.inner != nil {
		l.inner.Debugf(format, v...)
	}
}

func (l *leafRefusals) Tracef(format string, v ...any) {
	if l.inner != nil {
		l.inner.Tracef(format, v...)
	}
}
