package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/redact"
)

var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"clock": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("15:04:05.000")
	},
	"minute":        func(t time.Time) string { return t.UTC().Format("15:04") },
	"invocationURL": func(tenant, id string) string { return callPath("/invocations", tenant, id) },
	"decisionURL":   func(tenant, id string) string { return callPath("/approvals", tenant, id) },
	"us":            func(n int64) string { return (time.Duration(n) * time.Microsecond).String() },
	"statuses": func() []api.Status {
		return []api.Status{api.StatusPending, api.StatusRunning, api.StatusPendingApproval, api.StatusSuccess, api.StatusError,
			api.StatusTimeout, api.StatusCancelled, api.StatusPermissionDenied}
	},
}

// callPath is the console's path to one call under prefix: each of tenant
// and id escaped as one path segment, so any character survives (the mux
// unescapes them: r.PathValue). A "." or ".." segment no escaping keeps
// (browsers resolve %2e%2e too), so such a call goes in the query.
func callPath(prefix, tenant, id string) string {
	dots := func(s string) bool { return s == "." || s == ".." || s == "" }
	if dots(tenant) || dots(id) {
		return prefix + "?" + url.Values{"tenant": {tenant}, "id": {id}}.Encode()
	}
	return prefix + "/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

// callOf is the call a request names: in its path, or in its query on the
// routes without one (callPath).
func callOf(r *http.Request) (tenant, id string) {
	if r.Pattern == "GET /invocations" || r.Pattern == "POST /approvals" {
		q := r.URL.Query()
		return q.Get("tenant"), q.Get("id")
	}
	return r.PathValue("tenant"), r.PathValue("id")
}

// page is what every page template gets.
type page struct {
	Title, Nav string
	CSRF       string
	Notice     string
	Failure    string
	Data       any
	// After is the last audit event the console held when the page was
	// made: the page's live stream starts after it.
	After uint64
}

func (s *Server) render(w http.ResponseWriter, status int, name string, p page) {
	if p.After == 0 {
		p.After = s.audit.last()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := s.tmpl.ExecuteTemplate(w, name, p); err != nil {
		// Headers are gone; what was written stays, the error goes to the log of the request.
		_, _ = fmt.Fprintf(w, "\n<!-- template: %s -->", template.HTMLEscapeString(err.Error()))
	}
}

// pending is one approval as the inbox shows it.
type pending struct {
	api.ApprovalSummary
	Params      string
	Risk        string
	SideEffects []string
	Left        string
}

type inboxData struct {
	Approvals []pending
	Errors    []string
	Tenants   []string
}

func (s *Server) tenantList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.tenants))
	for t := range s.tenants {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

func (s *Server) pendingApprovals(ctx context.Context) inboxData {
	var d inboxData
	d.Tenants = s.tenantList()
	now := s.cfg.Now()
	type safety struct {
		Safety struct {
			Risk        string   `json:"risk_level"`
			SideEffects []string `json:"side_effects"`
		} `json:"safety"`
	}
	manifests := map[string]safety{}
	for _, t := range d.Tenants {
		as, err := s.cfg.Client.Approvals(ctx, t)
		if err != nil {
			d.Errors = append(d.Errors, fmt.Sprintf("tenant %s: %v", t, err))
			continue
		}
		for _, a := range as {
			p := pending{ApprovalSummary: a, Params: pretty(redact.Redact(a.Parameters))}
			key := a.ToolID + "@" + a.ToolVersion
			m, ok := manifests[key]
			if !ok {
				if doc, err := s.cfg.Client.GetTool(ctx, a.ToolID, a.ToolVersion); err == nil {
					_ = json.Unmarshal(doc, &m)
				}
				manifests[key] = m
			}
			p.Risk, p.SideEffects = m.Safety.Risk, m.Safety.SideEffects
			if left := a.Deadline.Sub(now); left > 0 {
				p.Left = left.Round(time.Second).String()
			} else {
				p.Left = "expired"
			}
			d.Approvals = append(d.Approvals, p)
		}
	}
	// The newest deadline first, as the inbox promises.
	slices.SortStableFunc(d.Approvals, func(a, b pending) int { return b.Deadline.Compare(a.Deadline) })
	return d
}

func pretty(b json.RawMessage) string {
	if len(b) == 0 {
		return ""
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	// Shown as the agent sent it: html/template escapes it for the page,
	// so \u003c would only hide from the reader what was sent.
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
	return strings.TrimRight(buf.String(), "\n")
}

func (s *Server) inbox(w http.ResponseWriter, r *http.Request, sess session) {
	after := s.audit.last()
	s.render(w, http.StatusOK, "inbox.html", page{Title: "Approvals", Nav: "inbox", CSRF: sess.csrf, Data: s.pendingApprovals(r.Context()), After: after})
}

// inboxList is the inbox's list alone, which the page fetches again when
// the audit trail says an approval changed.
func (s *Server) inboxList(w http.ResponseWriter, r *http.Request, sess session) {
	s.render(w, http.StatusOK, "approvals.html", page{CSRF: sess.csrf, Data: s.pendingApprovals(r.Context())})
}

// decide approves or denies as the console's operator, signed exactly as
// `toolgate approve` signs, naming the request digest the form showed.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, sess session) {
	tenant, id := callOf(r)
	approve := r.PostFormValue("decision") == "approve"
	if !approve && r.PostFormValue("decision") != "deny" {
		http.Error(w, "decision must be approve or deny", http.StatusBadRequest)
		return
	}
	d := api.ApprovalDecision{Tenant: tenant, InvocationID: id, Approve: approve, DecidedBy: s.cfg.By,
		Reason: r.PostFormValue("reason"), RequestDigest: r.PostFormValue("digest")}
	p := page{Title: "Approvals", Nav: "inbox", CSRF: sess.csrf}
	status := http.StatusOK
	a, err := s.cfg.Client.DecideSigned(r.Context(), d, s.cfg.Sign)
	var te *api.Error
	switch {
	case err == nil:
		p.Notice = fmt.Sprintf("%s %s (%s@%s) by %s", a.State, a.InvocationID, a.ToolID, a.ToolVersion, a.DecidedBy)
	case errors.As(err, &te) && te.ECode == api.EApprovalDecided:
		status = http.StatusConflict
		p.Failure = fmt.Sprintf("%s: someone decided %s first; the first decision counts (%s)", te.ECode, id, te.Message)
		if prev, err := s.cfg.Client.Approval(r.Context(), tenant, id); err == nil {
			p.Failure = fmt.Sprintf("%s: %s was already %s by %s; the first decision counts", te.ECode, id, prev.State, prev.DecidedBy)
		}
	case errors.As(err, &te):
		status = http.StatusConflict
		p.Failure = fmt.Sprintf("%s: %s", te.ECode, te.Message)
	default:
		status = http.StatusBadGateway
		p.Failure = err.Error()
	}
	p.Data = s.pendingApprovals(r.Context())
	s.render(w, status, "inbox.html", p)
}

// step is one line of an invocation's timeline.
type step struct {
	Event   Event
	Offset  string
	Stage   string
	Summary string
}

type invocationData struct {
	Tenant, ID string
	Record     *api.Record
	RecordErr  string
	Steps      []step
	Hops       []api.Hop
	Result     string
	Error      *api.Error
	TraceID    string
	HandedTo   string
	Parent     string
	Replayed   string
	Approval   *api.ApprovalSummary
	Meta       *api.ExecutionMetadata
	// Ended: the trail holds the invocation's terminal event. Audit writes
	// the status record before it publishes that event, so a page that
	// sees the record ended still waits live for the event.
	Ended bool
}

func (s *Server) invocation(w http.ResponseWriter, r *http.Request, sess session) {
	tenant, id := callOf(r)
	d := invocationData{Tenant: tenant, ID: id}
	after := s.audit.last()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if rec, err := s.cfg.Client.Status(ctx, tenant, id); err != nil {
		d.RecordErr = err.Error()
	} else {
		d.Record = &rec
		d.Error = rec.Error
		if resp := rec.Response; resp != nil {
			d.Result = pretty(redact.Redact(resp.Result))
			if resp.Error != nil {
				d.Error = resp.Error
			}
			if md := resp.ExecutionMetadata; md != nil {
				d.Meta = md
				d.Hops = md.Stages
				d.Replayed = md.ReplayedFrom
				if md.Hook != nil {
					d.HandedTo, d.Parent = md.Hook.HandedTo, md.Hook.Parent
				}
			}
		}
	}
	if a, err := s.cfg.Client.Approval(ctx, tenant, id); err == nil {
		d.Approval = &a
	}
	// The tenant's stored trail, read for this invocation's events, each
	// with its place in the stream, which its row links to.
	var evs []Event
	_ = s.cfg.Client.TailLastSeq(ctx, tenant, s.cfg.Window, func(seq uint64, subject string, data []byte) error {
		if e := parseEvent(subject, data); e.InvocationID == id {
			e.Seq = seq
			evs = append(evs, e)
		}
		return nil
	})
	slices.SortStableFunc(evs, func(a, b Event) int { return a.Time.Compare(b.Time) })
	for _, e := range evs {
		st := step{Event: e, Stage: strings.TrimPrefix(e.Source, "urn:toolgate:")}
		st.Offset = "+" + e.Time.Sub(evs[0].Time).Round(time.Microsecond).String()
		st.Summary = cmp.Or(e.Status, "-")
		if e.ECode != "" {
			st.Summary += " " + e.ECode
		}
		d.Steps = append(d.Steps, st)
		d.Ended = d.Ended || terminal(e.Type)
		if d.TraceID == "" && e.TraceParent != "" {
			if parts := strings.Split(e.TraceParent, "-"); len(parts) == 4 {
				d.TraceID = parts[1]
			}
		}
	}
	s.render(w, http.StatusOK, "invocation.html", page{Title: "Invocation " + id, Nav: "audit", CSRF: sess.csrf, Data: d, After: after})
}

func filterOf(r *http.Request) Filter {
	q := r.URL.Query()
	return Filter{Tenant: q.Get("tenant"), Type: q.Get("type"), Tool: q.Get("tool"), Status: q.Get("status"), Text: q.Get("q")}
}

func (s *Server) auditPage(w http.ResponseWriter, r *http.Request, sess session) {
	f := filterOf(r)
	data := struct {
		Filter  Filter
		Events  []Event
		Tenants []string
	}{f, s.audit.recent(f, 200), s.tenantList()}
	slices.Reverse(data.Events)
	s.render(w, http.StatusOK, "audit.html", page{Title: "Live audit", Nav: "audit", CSRF: sess.csrf, Data: data})
}

// auditStream sends the matching events from now on as server-sent
// events, each a JSON object the page writes as text.
func (s *Server) auditStream(w http.ResponseWriter, r *http.Request, _ session) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	f := filterOf(r)
	after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
	c, done := s.audit.subscribe()
	defer done()
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	send := func(e Event) bool {
		if e.Seq <= after || !f.match(e) {
			return true
		}
		b, _ := json.Marshal(e)
		_, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b)
		return err == nil
	}
	// What arrived between the page and the stream.
	for _, e := range s.audit.recent(f, 200) {
		if !send(e) {
			return
		}
	}
	fl.Flush()
	tick := time.NewTicker(15 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case e := <-c:
			if !send(e) {
				return
			}
			fl.Flush()
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// auditEvent shows the event at a sequence of the AUDIT stream: from the
// console's window, else read from the stream (an invocation's timeline
// links events older than the window).
func (s *Server) auditEvent(w http.ResponseWriter, r *http.Request, sess session) {
	seq, _ := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	e, ok := s.audit.get(seq)
	if !ok {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		subject, data, err := s.cfg.Client.AuditAt(ctx, seq)
		switch {
		case errors.Is(err, client.ErrNoAuditEvent):
			http.Error(w, "no audit event is stored at this sequence", http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, "reading the event from the audit trail: "+err.Error(), http.StatusBadGateway)
			return
		}
		e = parseEvent(subject, data)
		e.Seq = seq
	}
	data := struct {
		Event Event
		Raw   string
	}{e, string(e.Raw())}
	s.render(w, http.StatusOK, "event.html", page{Title: "Audit event", Nav: "audit", CSRF: sess.csrf, Data: data})
}

// minute is one row of the overview's calls per minute.
type minute struct {
	At       time.Time
	ByStatus map[string]int
	Total    int
}

type overviewData struct {
	Minutes    []minute
	Statuses   []string
	TopTools   []toolCount
	Breakers   []api.BreakerState
	BreakerErr string
	Budgets    []budgetRow
	BudgetErr  string
	BudgetNear int // percent
	// ShowBreakers and ShowBudgets: the console's credentials may read
	// them (an approver's may not: they are an admin's).
	ShowBreakers, ShowBudgets bool
}

// unreadable reports whether err is the bus refusing the console's
// credentials an endpoint (E3221): a panel they may not read is left
// out, not shown as a failure.
func unreadable(err error) bool {
	return errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EBusNotPermitted})
}

// budgetNear is the share of a cap from which the overview lists a
// session's budget.
const budgetNear = 0.8

// budgetRow is one session near a cap: the quantity nearest its cap.
type budgetRow struct {
	Tenant, Session, Quantity string
	Used, Cap                 string
	Percent, Width            int
	Exhausted                 bool
	Depletes                  string
}

func budgetRowOf(st api.BudgetStatus) budgetRow {
	share, q := st.UsedShare()
	used, capv := map[string]float64{
		"calls": float64(st.Used.Calls), "runtime_ms": float64(st.Used.RuntimeMS), "cost": st.Used.Cost, "tokens": float64(st.Used.Tokens),
	}[q], map[string]float64{
		"calls": float64(st.Limits.MaxCalls), "runtime_ms": float64(st.Limits.MaxRuntimeMS), "cost": st.Limits.MaxCost, "tokens": float64(st.Limits.MaxTokens),
	}[q]
	pct := int(share * 100)
	return budgetRow{Tenant: st.Tenant, Session: st.Session, Quantity: q,
		Used: strconv.FormatFloat(used, 'g', 6, 64), Cap: strconv.FormatFloat(capv, 'g', 6, 64),
		Percent: pct, Width: pct / 10 * 10, Exhausted: slices.Contains(st.Exhausted, q), Depletes: st.Depletes}
}

type toolCount struct {
	Tool  string
	Calls int
	Width int
}

// terminal reports whether an audit event type ends an invocation.
func terminal(typ string) bool {
	switch typ {
	case "tool.succeeded", "tool.failed", "tool.timeout", "tool.cancelled", "tool.rejected", "tool.permission_denied", "tool.rate_limited":
		return true
	}
	return false
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request, sess session) {
	var d overviewData
	now := s.cfg.Now().UTC().Truncate(time.Minute)
	const minutes = 15
	rows := make([]minute, minutes)
	for i := range rows {
		rows[i] = minute{At: now.Add(-time.Duration(minutes-1-i) * time.Minute), ByStatus: map[string]int{}}
	}
	statuses := map[string]bool{}
	tools := map[string]int{}
	for _, e := range s.audit.recent(Filter{}, s.cfg.Window) {
		if !terminal(e.Type) {
			continue
		}
		// By tool id: an event that ends a call before its version was
		// resolved names none.
		tool, _, _ := strings.Cut(e.Tool, "@")
		tools[tool]++
		i := minutes - 1 - int(now.Sub(e.Time.UTC().Truncate(time.Minute))/time.Minute)
		if i < 0 || i >= minutes {
			continue
		}
		st := cmp.Or(e.Status, e.Type)
		rows[i].ByStatus[st]++
		rows[i].Total++
		statuses[st] = true
	}
	slices.Reverse(rows)
	d.Minutes = rows
	for st := range statuses {
		d.Statuses = append(d.Statuses, st)
	}
	slices.Sort(d.Statuses)
	max := 0
	for t, n := range tools {
		d.TopTools = append(d.TopTools, toolCount{Tool: cmp.Or(t, "-"), Calls: n})
		max = maxInt(max, n)
	}
	slices.SortFunc(d.TopTools, func(a, b toolCount) int { return cmp.Or(b.Calls-a.Calls, strings.Compare(a.Tool, b.Tool)) })
	if len(d.TopTools) > 10 {
		d.TopTools = d.TopTools[:10]
	}
	for i := range d.TopTools {
		d.TopTools[i].Width = d.TopTools[i].Calls * 100 / maxInt(max, 1) / 10 * 10
	}
	bs, err := s.cfg.Client.Breakers(r.Context())
	d.ShowBreakers = !unreadable(err)
	if err != nil && d.ShowBreakers {
		d.BreakerErr = err.Error()
	}
	for _, b := range bs {
		if b.State != api.BreakerClosed {
			d.Breakers = append(d.Breakers, b)
		}
	}
	d.BudgetNear = int(budgetNear * 100)
	near, err := s.cfg.Client.Budgets(r.Context(), "", budgetNear)
	d.ShowBudgets = !unreadable(err)
	if err != nil && d.ShowBudgets {
		d.BudgetErr = err.Error()
	}
	for _, st := range near {
		d.Budgets = append(d.Budgets, budgetRowOf(st))
	}
	s.render(w, http.StatusOK, "overview.html", page{Title: "Overview", Nav: "overview", CSRF: sess.csrf, Data: d})
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}
