package client

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
)

// A request the server's permissions refuse gets no answer: the server
// only tells the connection, asynchronously ("Permissions Violation for
// Publish to ..."). refusals hears that on the connection's async error
// handler and fails the waiting requests it concerns at once, with an error
// saying which right was missing, instead of letting them wait out their
// deadline.
type refusals struct {
	mu      sync.Mutex
	pending map[*pendingRequest]struct{}
}

type pendingRequest struct {
	subject string
	cancel  context.CancelCauseFunc
}

var (
	publishRefused   = regexp.MustCompile(`(?i)Publish to "(\S+)"`)
	subscribeRefused = regexp.MustCompile(`(?i)Subscription to "(\S+)"`)
)

// watchRefusals installs the handler on nc, keeping any handler already
// there.
func watchRefusals(nc *nats.Conn) *refusals {
	r := &refusals{pending: map[*pendingRequest]struct{}{}}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, s *nats.Subscription, err error) {
		// A refusal some request reports is said there, once.
		if errors.Is(err, nats.ErrPermissionViolation) && r.refused(err.Error()) {
			return
		}
		if prev != nil {
			prev(c, s, err)
		}
	})
	return r
}

// track registers a request on subject (or, ending in ">", any subject it
// begins) until done is called; ctx ends with the refusal as its cause if
// the bus refuses it.
func (r *refusals) track(ctx context.Context, subject string) (context.Context, func()) {
	if r == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	p := &pendingRequest{subject: subject, cancel: cancel}
	r.mu.Lock()
	r.pending[p] = struct{}{}
	r.mu.Unlock()
	return ctx, func() {
		r.mu.Lock()
		delete(r.pending, p)
		r.mu.Unlock()
		cancel(nil)
	}
}

// refused fails the requests a permission violation concerns: those on a
// refused publish subject, and every one when the refused subscription is
// the reply inbox (no reply could reach any of them). It reports whether
// any was.
func (r *refusals) refused(msg string) bool {
	var hit func(*pendingRequest) bool
	var cause func(*pendingRequest) error
	switch {
	case publishRefused.MatchString(msg):
		subject := publishRefused.FindStringSubmatch(msg)[1]
		hit = func(p *pendingRequest) bool {
			prefix, wild := strings.CutSuffix(p.subject, ">")
			return p.subject == subject || wild && strings.HasPrefix(subject, prefix)
		}
		cause = func(*pendingRequest) error { return NotPermitted(subject) }
	case subscribeRefused.MatchString(msg):
		subject := subscribeRefused.FindStringSubmatch(msg)[1]
		if !strings.HasPrefix(subject, nats.InboxPrefix) {
			return false
		}
		hit = func(*pendingRequest) bool { return true }
		cause = func(*pendingRequest) error { return inboxRefused(subject) }
	default:
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	hitAny := false
	for p := range r.pending {
		if hit(p) {
			p.cancel(cause(p))
			hitAny = true
		}
	}
	return hitAny
}

// NotPermitted is the error of a request the bus refused to carry to
// subject (E3221): the connection's credentials may not publish there.
func NotPermitted(subject string) *api.Error {
	hint := "it needs operator credentials (--creds, or NATS_NKEY with NATS_TOKEN)"
	if strings.HasPrefix(subject, "tool.invoke.") {
		hint = "the token's tenant is not the one named: invoke with the token's own tenant"
	}
	e := api.NewError(api.PermissionDenied, api.EBusNotPermitted,
		"the bus refused to carry the request: these credentials may not publish to %s; an agent may call only its own tenant's endpoints (tool.svc.<tenant>.…); %s", subject, hint)
	e.Details = map[string]any{"subject": subject}
	return e
}

func inboxRefused(subject string) *api.Error {
	e := api.NewError(api.PermissionDenied, api.EBusInbox,
		"the bus refused the reply subscription %s: an agent's connection must use its inbox prefix _INBOX.<tenant>.<token id> (toolgate sets it from --token; nats CLI: --inbox-prefix)", subject)
	e.Details = map[string]any{"subject": subject}
	return e
}
