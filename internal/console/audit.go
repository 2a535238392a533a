package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/redact"
)

// Event is one audit event as the console shows it.
type Event struct {
	// Seq is the event's sequence in the AUDIT stream: what links to it.
	Seq          uint64    `json:"seq"`
	Time         time.Time `json:"time"`
	Tenant       string    `json:"tenant"`
	Type         string    `json:"type"` // the subject's event part: tool.succeeded, tool.approval.requested, …
	Source       string    `json:"source"`
	Tool         string    `json:"tool"`
	Status       string    `json:"status"`
	ECode        string    `json:"ecode"`
	InvocationID string    `json:"invocation_id"`
	TraceParent  string    `json:"traceparent,omitempty"`
	red          *redacted
}

// redacted is an event's text redacted again, worked out the first time it
// is wanted: redaction costs far more than reading the event, and most
// events are never opened or searched.
type redacted struct {
	once sync.Once
	data []byte
	out  json.RawMessage
}

// Raw is the whole event as stored, redacted again (redactEvent).
func (e Event) Raw() json.RawMessage {
	if e.red == nil {
		return nil
	}
	e.red.once.Do(func() {
		e.red.out, e.red.data = redactEvent(e.red.data), nil
	})
	return e.red.out
}

// parseEvent reads an audit event off subject audit.<tenant>.<event>.
// Whatever it cannot read stays empty: the raw event is still shown.
func parseEvent(subject string, data []byte) Event {
	var e struct {
		Time        time.Time `json:"time"`
		Source      string    `json:"source"`
		TraceParent string    `json:"traceparent"`
		Data        struct {
			TenantID     string     `json:"tenant_id"`
			InvocationID string     `json:"invocation_id"`
			ToolID       string     `json:"tool_id"`
			ToolVersion  string     `json:"tool_version"`
			Status       api.Status `json:"status"`
			Error        *api.Error `json:"error"`
		} `json:"data"`
	}
	_ = json.Unmarshal(data, &e)
	ev := Event{Time: e.Time, Source: e.Source, TraceParent: e.TraceParent, Tenant: e.Data.TenantID, InvocationID: e.Data.InvocationID,
		Status: string(e.Data.Status), red: &redacted{data: bytes.Clone(data)}}
	if parts := strings.SplitN(subject, ".", 3); len(parts) == 3 {
		ev.Tenant, ev.Type = parts[1], parts[2]
	} else {
		ev.Type = subject
	}
	ev.Tool = e.Data.ToolID
	if ev.Tool != "" && e.Data.ToolVersion != "" {
		ev.Tool += "@" + e.Data.ToolVersion
	}
	if e.Data.Error != nil {
		ev.ECode = e.Data.Error.ECode
	}
	return ev
}

// redactEvent passes the whole event through audit's redaction once more
// (credential-named members at any depth, then the secret and personal
// data detectors), so what the console shows is never less redacted than
// the trail, whoever published the event and however its members are
// spelled.
func redactEvent(data []byte) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		// Not an object: nothing can be redacted by name in it, so it is not shown.
		b, _ := json.Marshal(fmt.Sprintf("[an event that is not a JSON object, %d bytes: see toolgate tail --json]", len(data)))
		return b
	}
	var v any
	if json.Unmarshal(redact.Redact(data), &v) != nil {
		return json.RawMessage(`"[REDACTED]"`)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the page escapes; \u003c would hide what was sent
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return json.RawMessage(`"[REDACTED]"`)
	}
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// Filter selects events: every non-empty field must match.
type Filter struct {
	Tenant, Type, Tool, Status, Text string
}

func (f Filter) match(e Event) bool {
	has := func(s, sub string) bool {
		return sub == "" || strings.Contains(strings.ToLower(s), strings.ToLower(sub))
	}
	return (f.Tenant == "" || e.Tenant == f.Tenant) && has(e.Type, f.Type) && has(e.Tool, f.Tool) &&
		(f.Status == "" || e.Status == f.Status) && (f.Text == "" || has(string(e.Raw()), f.Text))
}

// hub keeps the last events and hands new ones to the live views.
type hub struct {
	mu   sync.Mutex
	size int
	seq  uint64 // the last event's sequence in the stream
	n    uint64 // events taken in
	// ring holds events in the stream's order: their sequences rise.
	ring   []Event
	subs   map[chan Event]struct{}
	loaded chan struct{}
}

func newHub(size int) *hub {
	return &hub{size: size, subs: map[chan Event]struct{}{}, loaded: make(chan struct{})}
}

// add keeps e, which comes after every event kept so far.
func (h *hub) add(e Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	h.seq = e.Seq
	h.ring = append(h.ring, e)
	// Trimmed only at twice its size, so keeping an event costs a copy of
	// the window only once every size events.
	if len(h.ring) >= 2*h.size {
		h.ring = append(h.ring[:0:0], h.ring[len(h.ring)-h.size:]...)
	}
	for c := range h.subs {
		select {
		case c <- e:
		default: // a view that cannot keep up loses events, never slows the rest
		}
	}
}

// recent returns the kept events that match f, oldest first, at most n.
// The text filter, which may redact events, runs outside the lock, so a
// search never holds up the trail.
func (h *hub) recent(f Filter, n int) []Event {
	text := f.Text
	f.Text = ""
	h.mu.Lock()
	var cand []Event
	for i := len(h.ring) - 1; i >= h.oldest() && (text != "" || len(cand) < n); i-- {
		if f.match(h.ring[i]) {
			cand = append(cand, h.ring[i])
		}
	}
	h.mu.Unlock()
	out := cand[:0]
	for _, e := range cand {
		if len(out) == n {
			break
		}
		if (Filter{Text: text}).match(e) {
			out = append(out, e)
		}
	}
	slices.Reverse(out)
	return out
}

// oldest is the index of the oldest event in the window.
func (h *hub) oldest() int { return max(0, len(h.ring)-h.size) }

func (h *hub) last() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

func (h *hub) count() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

func (h *hub) get(seq uint64) (Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	win := h.ring[h.oldest():]
	i, ok := slices.BinarySearchFunc(win, seq, func(e Event, seq uint64) int { return cmp.Compare(e.Seq, seq) })
	if !ok {
		return Event{}, false
	}
	return win[i], true
}

func (h *hub) subscribe() (chan Event, func()) {
	c := make(chan Event, 256)
	h.mu.Lock()
	h.subs[c] = struct{}{}
	h.mu.Unlock()
	return c, func() {
		h.mu.Lock()
		delete(h.subs, c)
		h.mu.Unlock()
	}
}

// Ingested counts the audit events the console has taken in since it
// started, the stored backlog included: set against the events the trail
// received it says whether the console keeps up (make bench).
func (s *Server) Ingested() uint64 { return s.audit.count() }

// Run reads the last Backlog stored audit events, then follows new ones,
// until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	take := func(seq uint64, subject string, data []byte) error {
		e := parseEvent(subject, data)
		e.Seq = seq
		if e.Tenant != "" && !strings.HasPrefix(e.Tenant, "_") {
			s.mu.Lock()
			s.tenants[e.Tenant] = true
			s.mu.Unlock()
		}
		s.audit.add(e)
		return nil
	}
	err := s.cfg.Client.TailLastSeq(ctx, "", s.cfg.Backlog, take)
	close(s.audit.loaded)
	if err != nil {
		return err
	}
	return s.cfg.Client.TailSeq(ctx, "", false, take)
}
