package node

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/toolgate/toolgate/internal/busauth"
)

// clientRefusals audits what the embedded server refuses an admitted
// connection by its permissions, a publish (a JetStream API request
// included) or a subscription: the server answers the client and says so
// only in its log. A credential's first refusal is audited as the bus's
// refusal (bus.refused), then at most one a refusalWindow, so that a
// client repeating a refused publish cannot flood the audit trail; the
// event says so.
type clientRefusals struct {
	srv     atomic.Pointer[server.Server]
	auditor *refusalAuditor
	window  time.Duration
	queue   chan clientRefusal
	start   sync.Once
	dropped atomic.Uint64 // refusals the queue had no room for

	mu   sync.Mutex
	next map[string]time.Time // credential (its user name) -> when its next refusal is audited
}

// refusalWindow is how long after a credential's audited refusal its next
// one is audited.
const refusalWindow = time.Minute

// clientRefusalQueue bounds the refusals waiting to be looked up.
const clientRefusalQueue = 256

// maxRefusalWindows bounds the credentials remembered: past it, those
// whose window ended are forgotten.
const maxRefusalWindows = 4096

type clientRefusal struct {
	cid  uint64
	what string
	at   time.Time
}

func newClientRefusals(ns *server.Server, auditor *refusalAuditor) *clientRefusals {
	c := &clientRefusals{auditor: auditor, window: refusalWindow, queue: make(chan clientRefusal, clientRefusalQueue)}
	c.srv.Store(ns)
	return c
}

// violationLine matches nats-server's log line of a client's refused
// publish, reply subject or subscription (pubPermissionViolation,
// replySubjectViolation, subPermissionViolation): the connection's id,
// then what was refused.
var violationLine = regexp.MustCompile(` - cid:(\d+) - .*?((?:Publish|Subscription) Violation - .*)$`)

// logged reads a line of the server's error log. The server may hold its
// locks while it logs: this only queues.
func (c *clientRefusals) logged(line string) {
	m := violationLine.FindStringSubmatch(line)
	if m == nil {
		return
	}
	cid, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return
	}
	c.start.Do(func() { go c.run() })
	select {
	case c.queue <- clientRefusal{cid: cid, what: m[2], at: time.Now()}:
	default:
		c.dropped.Add(1)
	}
}

// run audits the queued refusals, for as long as the process runs.
func (c *clientRefusals) run() {
	for r := range c.queue {
		c.audit(r)
	}
}

func (c *clientRefusals) audit(r clientRefusal) {
	ref := busauth.Refusal{Time: r.at, ClientID: r.cid}
	user := "cid:" + strconv.FormatUint(r.cid, 10)
	if s := c.srv.Load(); s != nil {
		ref.ServerID = s.ID()
		if cz, err := s.Connz(&server.ConnzOptions{CID: r.cid, Username: true}); err == nil && len(cz.Conns) == 1 {
			ci := cz.Conns[0]
			ref.Host = ci.IP
			if ci.AuthorizedUser != "" {
				user = ci.AuthorizedUser
			}
			if id, err := busauth.ParseUserName(ci.AuthorizedUser); err == nil {
				ref.Role, ref.Tenant, ref.TokenID, ref.Name = id.Role, id.Tenant, id.TokenID, id.Name
			}
		}
	}
	if !c.due(user, r.at) {
		return
	}
	reason := fmt.Sprintf("%s; this credential's further refusals within %v are not recorded", r.what, c.window)
	if n := c.dropped.Swap(0); n > 0 {
		reason += fmt.Sprintf("; %d refusals came too fast to be examined", n)
	}
	ref.Err = fmt.Errorf("%w: %s", busauth.ErrPermission, reason)
	c.auditor.Refused(context.Background(), ref)
}

// due reports whether user's refusal at now is audited, and if so starts
// its window.
func (c *clientRefusals) due(user string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if next, ok := c.next[user]; ok && now.Before(next) {
		return false
	}
	if c.next == nil {
		c.next = map[string]time.Time{}
	}
	if len(c.next) >= maxRefusalWindows {
		for u, next := range c.next {
			if !now.Before(next) {
				delete(c.next, u)
			}
		}
	}
	c.next[user] = now.Add(c.window)
	return true
}
