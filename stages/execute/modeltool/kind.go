// Package modeltool runs tools of kind model: it routes each call to a model
// of the catalogue (internal/modelrouter), sends it to one of the model's
// endpoints in the provider's wire format (OpenAI chat completions or
// Anthropic Messages, streamed or not), and moves down the fallback chain
// when an endpoint fails, hangs, is rate limited or has its circuit breaker
// open. Credentials are injected and scrubbed, and hosts confined, exactly
// as for http tools (httptool's code).
//
// The parameters of a call are a JSON object:
//
//	{"messages": [{"role": "user", "content": "…"}], "system": "…",
//	 "model": "…", "tier": "small|medium|large", "hint": "best|fast",
//	 "task": {"type": "coding", "traits": ["multi_step_reasoning"], "language": "go"},
//	 "constraints": {"max_cost": 0.01, "max_latency_ms": 3000, "capabilities": ["code"]},
//	 "policy": "cost-first|quality-first|latency-first",
//	 "max_output_tokens": 256, "temperature": 0.2, "stream": true,
//	 "truncate": "none|drop_oldest|drop_middle|summarize|split|retrieve"}
//
// ("prompt": "…" is short for one user message). The result is
//
//	{"model": "…", "content": "…", "finish_reason": "…",
//	 "usage": {"input_tokens": 12, "output_tokens": 30}, "cost": 0.0004,
//	 "parts": 3, "resumed_parts": 1}  (only for a split request)
//
// and the routing decision, every attempt and the tokens used are recorded
// in the execution metadata (model), which the audit event carries and the
// session's budget is charged from.
package modeltool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/breaker"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/httptool"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// Config configures the model kind.
type Config struct {
	// Catalogue holds the models; nil refuses every call.
	Catalogue *modelrouter.Catalogue
	// Rules classify requests; default modelrouter.DefaultRules.
	Rules *modelrouter.Rules
	// Secrets supplies credentials (secrets.Source does).
	Secrets httptool.Secrets
	// Transport sends requests; default a fresh httptool Kind's, which
	// refuses host names resolving to non-public addresses.
	Transport http.RoundTripper
	// Breakers, when set, guard every endpoint.
	Breakers *breaker.Breakers
	// Stats, when set, records latency, outcomes, tokens and cost in
	// Prometheus.
	Stats *Stats
	// Recorder, when set, records the same per call in the cluster-wide
	// model statistics (KV).
	Recorder Recorder
	// Observer, when set, tells routing what the cluster has recently seen
	// of each model (latency, success rate).
	Observer Observer
	// EndpointTimeout bounds one call to one endpoint when the model sets
	// no timeout_ms; default 60 s. The tool's time limit bounds them all.
	EndpointTimeout time.Duration
}

// Kind runs model tools. It implements execute.Kind.
type Kind struct {
	cfg   Config
	rules modelrouter.Rules
	rr    sync.Map // model name → *atomic.Uint64, round-robin over endpoints
}

// New returns the model kind.
func New(c Config) *Kind {
	if c.Transport == nil {
		c.Transport = httptool.New(httptool.Config{Secrets: c.Secrets}).Transport()
	}
	if c.EndpointTimeout <= 0 {
		c.EndpointTimeout = 60 * time.Second
	}
	k := &Kind{cfg: c, rules: modelrouter.DefaultRules()}
	if c.Rules != nil {
		k.rules = *c.Rules
	}
	return k
}

// Spec is the model object of a manifest of kind model.
type Spec struct {
	// Models, when not empty, are the only catalogue models the tool uses.
	Models []string `json:"models,omitempty"`
	// Policy is the default routing policy.
	Policy string `json:"policy,omitempty"`
	// Stream streams answers unless a call says otherwise.
	Stream bool `json:"stream,omitempty"`
	// Truncate is the default truncation strategy.
	Truncate string `json:"truncate,omitempty"`
	// MaxResponseBytes bounds a provider's answer; default 1 MiB,
	// narrowed by limits.output_bytes.
	MaxResponseBytes int64 `json:"max_response_bytes,omitempty"`
}

// Params are a call's parameters.
type Params struct {
	Messages        []modelrouter.Message   `json:"messages,omitempty"`
	Prompt          string                  `json:"prompt,omitempty"`
	System          string                  `json:"system,omitempty"`
	Model           string                  `json:"model,omitempty"`
	Tier            string                  `json:"tier,omitempty"`
	Hint            string                  `json:"hint,omitempty"`
	Task            modelrouter.Task        `json:"task,omitzero"`
	Constraints     modelrouter.Constraints `json:"constraints,omitzero"`
	Policy          string                  `json:"policy,omitempty"`
	MaxOutputTokens int                     `json:"max_output_tokens,omitempty"`
	Temperature     *float64                `json:"temperature,omitempty"`
	Stream          *bool                   `json:"stream,omitempty"`
	Truncate        string                  `json:"truncate,omitempty"`
}

// Result is a call's result.
type Result struct {
	Model        string `json:"model"`
	Content      string `json:"content"`
	FinishReason string `json:"finish_reason,omitempty"`
	Usage        struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	Cost float64 `json:"cost"`
	// Parts is how many calls a split request took (truncate "split").
	Parts int `json:"parts,omitempty"`
	// ResumedParts is how many of them a resumed run found answered in its
	// checkpoint, and did not send again.
	ResumedParts int `json:"resumed_parts,omitempty"`
}

func misconfigured(m *tools.Manifest, format string, args ...any) *api.Error {
	return api.NewError(api.ToolExecutionError, api.EExecutorUnavailable,
		"model configuration of %s: %s", m.Key(), fmt.Sprintf(format, args...)).WithDetail("not_started", true)
}

func decodeSpec(m *tools.Manifest) (*Spec, error) {
	if len(bytes.TrimSpace(m.Spec())) == 0 {
		return nil, misconfigured(m, "missing")
	}
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(m.Spec()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, misconfigured(m, "%v", err)
	}
	if s.Policy != "" && !slices.Contains(modelrouter.Policies, s.Policy) {
		return nil, misconfigured(m, "policy %q is not one of %v", s.Policy, modelrouter.Policies)
	}
	if err := checkTruncate(s.Truncate); err != nil {
		return nil, misconfigured(m, "%v", err)
	}
	if s.MaxResponseBytes < 0 {
		return nil, misconfigured(m, "max_response_bytes is negative")
	}
	if s.MaxResponseBytes == 0 {
		s.MaxResponseBytes = httptool.DefaultMaxResponseBytes
	}
	if o := m.Limits.OutputBytes; o > 0 && o < s.MaxResponseBytes {
		s.MaxResponseBytes = o
	}
	return &s, nil
}

func checkTruncate(t string) error {
	if t == "" || slices.Contains(modelrouter.Strategies, t) {
		return nil
	}
	return fmt.Errorf("truncate %q is not one of %s", t, strings.Join(modelrouter.Strategies, ", "))
}

func badParams(format string, args ...any) error {
	return api.NewError(api.InvalidParameters, api.EParametersInvalid, format, args...).WithDetail("not_started", true)
}

// Prepare implements execute.Kind.
func (k *Kind) Prepare(m *tools.Manifest, inv *envelope.Invocation) (kind.Func, error) {
	s, err := decodeSpec(m)
	if err != nil {
		return nil, err
	}
	if k.cfg.Catalogue == nil {
		return nil, misconfigured(m, "no model catalogue on this worker")
	}
	var g envelope.Grants
	if inv.Authz != nil {
		g = inv.Authz.Grants
	}
	c := &call{kind: k, m: m, spec: s, grants: g}
	if inv.Authz != nil {
		c.holdTokens, c.holdCost = inv.Authz.ModelTokens, inv.Authz.ModelCost
	}
	return c.run, nil
}

// call is one invocation.
type call struct {
	kind   *Kind
	m      *tools.Manifest
	spec   *Spec
	grants envelope.Grants
	// holdTokens and holdCost are what the call's requests may use
	// together (the budget authorize held for it); 0 bounds nothing.
	holdTokens int64
	holdCost   float64
}

// fit sizes a request's answer (maxTokens) to what the call's hold leaves
// once used is spent, counting the prompt at its worst: a byte per token,
// plus each message's framing. A request that cannot fit one answer token
// is not sent (E3211): a token's max_tokens and max_cost are never passed,
// whatever the provider answers within max_tokens.
func (c *call) fit(model *modelrouter.Model, p *Params, maxTokens int, used api.ModelUse) (int, error) {
	if c.holdTokens <= 0 && c.holdCost <= 0 {
		return maxTokens, nil
	}
	in := int64(len(p.System)) + 16
	for _, m := range p.Messages {
		in += int64(len(m.Role)+len(m.Content)) + 8
	}
	out := int64(maxTokens)
	if c.holdTokens > 0 {
		out = min(out, c.holdTokens-used.InputTokens-used.OutputTokens-in)
	}
	if c.holdCost > 0 {
		left := c.holdCost - used.Cost - model.Price.Cost(in, 0)
		switch {
		case left < 0:
			out = 0
		case model.Price.OutputPer1K > 0:
			out = min(out, int64(math.Floor(left*1000/model.Price.OutputPer1K*(1-1e-9))))
		}
	}
	if out < 1 {
		return 0, api.NewError(api.ResourceExhausted, api.EBudgetExhausted,
			"budget exhausted: a request to %s (a prompt of up to %d tokens) does not fit what the call's budget leaves (%d tokens, %g cost held)",
			model.Name, in, c.holdTokens, c.holdCost)
	}
	return int(out), nil
}

// params decodes a call's parameters; documents handed in the manifest's
// documents parameter join the system prompt.
func (c *call) params(raw json.RawMessage) (*Params, error) {
	raw, docs, err := withDocuments(c.m, raw)
	if err != nil {
		return nil, err
	}
	p, err := c.decodeParams(raw)
	if err == nil && docs != "" {
		p.System = strings.TrimSpace(p.System + "\n\n" + docs)
	}
	return p, err
}

func (c *call) decodeParams(raw json.RawMessage) (*Params, error) {
	var p Params
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, badParams("model parameters: %v", err)
	}
	if p.Prompt != "" {
		p.Messages = append(p.Messages, modelrouter.Message{Role: "user", Content: p.Prompt})
	}
	if len(p.Messages) == 0 {
		return nil, badParams("model parameters: no messages and no prompt")
	}
	for i, msg := range p.Messages {
		if msg.Role != "user" && msg.Role != "assistant" && msg.Role != "system" {
			return nil, badParams("messages[%d].role %q is not user, assistant or system", i, msg.Role)
		}
	}
	if p.MaxOutputTokens < 0 {
		return nil, badParams("max_output_tokens is negative")
	}
	if p.Truncate == "" {
		p.Truncate = c.spec.Truncate
	}
	if err := checkTruncate(p.Truncate); err != nil {
		return nil, badParams("%v", err)
	}
	if p.Policy == "" {
		p.Policy = c.spec.Policy
	}
	return &p, nil
}

// run is one attempt of the executor: routing, then the chain.
func (c *call) run(ctx context.Context, raw json.RawMessage) (json.RawMessage, error) {
	p, err := c.params(raw)
	if err != nil {
		return nil, err
	}
	catalogue := c.kind.cfg.Catalogue.Snapshot()
	for _, name := range c.spec.Models {
		if _, ok := catalogue[name]; !ok {
			return nil, api.NewError(api.ToolExecutionError, api.EModelUnknown,
				"%s allows model %q, which the catalogue does not hold", c.m.Key(), name).WithDetail("not_started", true)
		}
	}
	req := modelrouter.Request{Model: p.Model, Tier: p.Tier, Hint: p.Hint, Task: p.Task, Constraints: p.Constraints,
		Policy: p.Policy, MaxOutputTokens: p.MaxOutputTokens, Allowed: c.spec.Models,
		InputTokens: modelrouter.CountMessages(p.System, p.Messages)}
	if c.kind.cfg.Observer != nil {
		req.Observe = c.kind.cfg.Observer(c.kind.taskType(p.Task.Type))
	}
	rules := c.kind.rules
	if rk, _ := c.kind.cfg.Catalogue.Ranker(); rk != nil {
		rules.Ranker = rk
	}
	use := api.ModelUse{}
	meter := kind.MeterFrom(ctx)
	if prev := meter.Model(); prev != nil {
		// An earlier attempt of the executor's retry policy: what it used
		// is charged too.
		use.InputTokens, use.OutputTokens, use.Cost = prev.InputTokens, prev.OutputTokens, prev.Cost
		use.Attempts = prev.Attempts
	}
	d, err := rules.Route(ctx, catalogue, req)
	var parts [][]modelrouter.Message
	if ecodeOf(err) == api.EModelContextWindow && p.Truncate != "" && p.Truncate != modelrouter.TruncateNone {
		// Fit the largest window the request may use, at the seed's 70 %.
		limit := 0
		for _, m := range catalogue {
			if (p.Model == "" || p.Model == m.Name) && (len(c.spec.Models) == 0 || slices.Contains(c.spec.Models, m.Name)) {
				out := min(cmpOr(p.MaxOutputTokens, m.MaxOutputTokens), m.MaxOutputTokens)
				limit = max(limit, min(m.ContextWindow*7/10, m.ContextWindow-out))
			}
		}
		fitted, ok := p.Messages, false
		switch p.Truncate {
		case modelrouter.TruncateOldest, modelrouter.TruncateMiddle:
			fitted, ok = modelrouter.Truncate(p.Truncate, p.System, p.Messages, limit)
		case modelrouter.TruncateRetrieve:
			fitted, ok = modelrouter.Retrieve(p.System, p.Messages, limit)
		case modelrouter.TruncateSummarize:
			var serr error
			fitted, ok, serr = c.summarize(ctx, catalogue, p, limit, &use, meter)
			if serr != nil {
				use.Routing = &d.Routing
				meter.SetModel(use)
				return nil, serr
			}
		case modelrouter.TruncateSplit:
			parts, ok = modelrouter.Split(p.System, p.Messages, limit)
			if ok {
				fitted = parts[0]
				for _, part := range parts[1:] {
					if modelrouter.CountMessages(p.System, part) > modelrouter.CountMessages(p.System, fitted) {
						fitted = part
					}
				}
			}
		}
		if ok {
			p.Messages = fitted
			req.InputTokens = modelrouter.CountMessages(p.System, p.Messages)
			d, err = rules.Route(ctx, catalogue, req)
			d.Routing.Truncated = p.Truncate
		}
	}
	use.Routing = &d.Routing
	if err != nil {
		meter.SetModel(use)
		return nil, err
	}
	stream := c.spec.Stream
	if p.Stream != nil {
		stream = *p.Stream
	}
	if parts == nil {
		ans, model, err := c.callChain(ctx, d.Chain, p, stream, &use, meter)
		if err != nil {
			return nil, err
		}
		out := Result{Model: model, Content: ans.Content, FinishReason: ans.FinishReason, Cost: use.Cost}
		out.Usage.InputTokens, out.Usage.OutputTokens = ans.InputTokens, ans.OutputTokens
		return json.Marshal(out)
	}
	return c.runParts(ctx, d.Chain, p, parts, stream, &use, meter)
}

// runParts sends one request per part, in order, and joins the answers.
// After each answer it saves a micro checkpoint holding the answers so far,
// so that a run resumed from it (a redelivery after a worker died, or
// resume_from_checkpoint_id) sends only the parts not yet answered.
func (c *call) runParts(ctx context.Context, chain []*modelrouter.Model, p *Params, parts [][]modelrouter.Message,
	stream bool, use *api.ModelUse, meter *kind.Meter) (json.RawMessage, error) {
	progress := kind.ProgressFrom(ctx)
	st := splitState{Parts: len(parts), Digest: partsDigest(p.System, parts)}
	st.Answers = resumedAnswers(progress.Resumed(), st)
	resumed := len(st.Answers)
	for i := resumed; i < len(parts); i++ {
		pp := *p
		pp.Messages = parts[i]
		spent := use.Cost
		ans, model, err := c.callChain(ctx, chain, &pp, stream, use, meter)
		if err != nil {
			return nil, err
		}
		st.Answers = append(st.Answers, partAnswer{Model: model, Content: ans.Content, FinishReason: ans.FinishReason,
			InputTokens: ans.InputTokens, OutputTokens: ans.OutputTokens, Cost: use.Cost - spent})
		if i == len(parts)-1 {
			break // the answer is the result: nothing left to resume
		}
		progress.Report(float64(i+1)*100/float64(len(parts)), fmt.Sprintf("part %d of %d answered", i+1, len(parts)))
		state, err := json.Marshal(checkpointState{Split: &st})
		if err != nil {
			return nil, err
		}
		if err := progress.Checkpoint(state); err != nil {
			return nil, err
		}
	}
	// The result covers every part: those answered before the resume
	// (their cost was charged to the run that asked) and this run's.
	out := Result{Parts: len(parts), ResumedParts: resumed, Cost: use.Cost}
	contents := make([]string, len(st.Answers))
	for i, a := range st.Answers {
		contents[i] = a.Content
		out.Model, out.FinishReason = a.Model, a.FinishReason
		out.Usage.InputTokens += a.InputTokens
		out.Usage.OutputTokens += a.OutputTokens
		if i < resumed {
			out.Cost += a.Cost
		}
	}
	out.Content = strings.Join(contents, "\n\n")
	return json.Marshal(out)
}

// callChain calls the models of chain in order until one answers; use
// records every attempt and is left in the meter. A model whose endpoints
// all fail transiently is tried again (its retry policy) before the chain
// moves on; a request the provider calls invalid ends the chain, since
// another model would be sent the same request.
func (c *call) callChain(ctx context.Context, chain []*modelrouter.Model, p *Params, stream bool, use *api.ModelUse, meter *kind.Meter) (modelrouter.Answer, string, error) {
	var last error
chain:
	for _, model := range chain {
		use.Model = model.Name
		policy := model.RetryPolicy()
		delay := time.Duration(policy.BaseDelayMS) * time.Millisecond
		for round := 1; ; round++ {
			ans, err := c.tryModel(ctx, model, p, stream, use, meter)
			if err == nil {
				meter.SetModel(*use)
				return ans, model.Name, nil
			}
			last = err
			if ctx.Err() != nil || invalidRequest(err) {
				break chain
			}
			if round >= policy.MaxAttempts || !retrySameModel(err) || !c.wait(ctx, backoff(delay, err)) {
				break
			}
			delay *= 2
		}
	}
	meter.SetModel(*use)
	if ctx.Err() != nil {
		return modelrouter.Answer{}, "", ctx.Err()
	}
	if invalidRequest(last) {
		return modelrouter.Answer{}, "", api.AsError(last).WithDetail("attempts", use.Attempts)
	}
	return modelrouter.Answer{}, "", exhausted(c.m, use, last)
}

// invalidRequest reports whether the provider refused the request itself
// (a 4xx but 408, 429, 401 and 403): the model router specification does
// not pass such a request down the chain. 401 and 403 are the endpoint's
// credential, which the next model does not share.
func invalidRequest(err error) bool {
	te := api.AsError(err)
	if te.ECode != api.EExternalStatus || te.Retryable {
		return false
	}
	status, _ := te.Details["status"].(int)
	return status >= 400 && status < 500
}

// retrySameModel reports whether another round on the same model may
// succeed: a transient failure, not an open breaker (it stays open for
// longer than a retry waits) nor a refusal before any request was sent.
func retrySameModel(err error) bool {
	te := api.AsError(err)
	return te.Retryable && te.ECode != api.EBreakerOpen
}

// backoff is the wait before the next round: the doubling delay, or the
// provider's Retry-After when that is longer.
func backoff(delay time.Duration, err error) time.Duration {
	if ms, ok := api.AsError(err).Details["retry_after_ms"].(int64); ok && time.Duration(ms)*time.Millisecond > delay {
		return time.Duration(ms) * time.Millisecond
	}
	return delay
}

// wait sleeps for d unless ctx ends first; false moves the chain on. A
// wait that would take half the time the call has left is not taken: the
// rest of the chain gets that time instead.
func (c *call) wait(ctx context.Context, d time.Duration) bool {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 2*d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// summarize replaces the cold context of p (the messages before the most
// recent ones that fill half of limit) by a summary: the cheapest model
// the tool may use that fits each piece of it writes one, and what it
// costs is charged with the call. ok is false when the result still does
// not fit.
func (c *call) summarize(ctx context.Context, catalogue map[string]*modelrouter.Model, p *Params, limit int, use *api.ModelUse, meter *kind.Meter) ([]modelrouter.Message, bool, error) {
	cold, hot := modelrouter.Cold(p.System, p.Messages, limit)
	room := limit - modelrouter.CountMessages(p.System, hot) - 32
	if len(cold) == 0 || room < 32 {
		return p.Messages, false, nil
	}
	pieces := modelrouter.Passages(modelrouter.Transcript(cold), max(limit/2, 64))
	per := max(room/len(pieces), 16)
	var summaries []string
	for _, piece := range pieces {
		sp := &Params{System: modelrouter.SummaryPrompt, Messages: []modelrouter.Message{{Role: "user", Content: piece}}, MaxOutputTokens: per}
		sreq := modelrouter.Request{Policy: modelrouter.CostFirst, Allowed: c.spec.Models,
			MaxOutputTokens: per, InputTokens: modelrouter.CountMessages(sp.System, sp.Messages)}
		if c.kind.cfg.Observer != nil {
			sreq.Observe = c.kind.cfg.Observer(TaskTypeNone)
		}
		d, err := c.kind.rules.Route(ctx, catalogue, sreq)
		if err != nil {
			return nil, false, err
		}
		ans, _, err := c.callChain(ctx, d.Chain, sp, false, use, meter)
		if err != nil {
			return nil, false, err
		}
		summaries = append(summaries, strings.TrimSpace(ans.Content))
	}
	msgs := append([]modelrouter.Message{modelrouter.SummaryMessage(strings.Join(summaries, "\n\n"))}, hot...)
	return msgs, modelrouter.CountMessages(p.System, msgs) <= limit, nil
}

func ecodeOf(err error) string {
	var te *api.Error
	if errors.As(err, &te) {
		return te.ECode
	}
	return ""
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

// exhausted is the error of a chain that failed throughout: the one error
// when every attempt failed alike, else model_chain_exhausted.
func exhausted(m *tools.Manifest, use *api.ModelUse, last error) error {
	te := api.AsError(last)
	same := len(use.Attempts) > 0
	for _, a := range use.Attempts {
		same = same && a.ECode == te.ECode
	}
	if !same {
		e := api.NewError(te.Code, api.EModelChainExhausted, "%s: every model in the fallback chain failed; the last: %s", m.Key(), te.Message)
		if te.Retryable {
			e.AsRetryable()
		}
		te = e
	}
	return te.WithDetail("attempts", use.Attempts)
}

// tryModel calls the model's endpoints in round-robin order until one
// answers. It adds each attempt and its cost to use.
func (c *call) tryModel(ctx context.Context, model *modelrouter.Model, p *Params, stream bool, use *api.ModelUse, meter *kind.Meter) (modelrouter.Answer, error) {
	header, scrub, err := c.credential(model)
	if err != nil {
		use.Attempts = append(use.Attempts, attempt(model, "", err, 0))
		return modelrouter.Answer{}, err
	}
	n := len(model.Endpoints)
	ctr, _ := c.kind.rr.LoadOrStore(model.Name, new(atomic.Uint64))
	first := int(ctr.(*atomic.Uint64).Add(1)-1) % n
	var last error
	for i := range n {
		ep := model.Endpoints[(first+i)%n]
		use.Endpoint = ep
		start := time.Now()
		ans, err := c.tryEndpoint(ctx, model, ep, p, stream, header, scrub, *use)
		ms := time.Since(start).Milliseconds()
		cost := model.Price.Cost(ans.InputTokens, ans.OutputTokens)
		use.InputTokens += ans.InputTokens
		use.OutputTokens += ans.OutputTokens
		use.Cost += cost
		if err != nil {
			err = scrubErr(err, scrub)
		}
		use.Attempts = append(use.Attempts, attempt(model, ep, err, ms))
		meter.SetModel(*use)
		if err == nil {
			return ans, nil
		}
		last = err
		if ctx.Err() != nil || invalidRequest(err) {
			break
		}
	}
	return modelrouter.Answer{}, last
}

func attempt(m *modelrouter.Model, ep string, err error, ms int64) api.ModelAttempt {
	a := api.ModelAttempt{Model: m.Name, Endpoint: ep, MS: ms}
	if err != nil {
		te := api.AsError(err)
		a.ECode, a.Error = te.ECode, te.Message
	}
	return a
}

func scrubErr(err error, s *httptool.Scrubber) error {
	var te *api.Error
	if errors.As(err, &te) {
		te.Message = s.String(te.Message)
		return te
	}
	return errors.New(s.String(err.Error()))
}

// credential resolves the model's credential, which the token must grant.
func (c *call) credential(model *modelrouter.Model) (http.Header, *httptool.Scrubber, error) {
	cr := model.Credential
	if cr == nil {
		return nil, nil, nil
	}
	if !slices.Contains(c.grants.Secrets, cr.Secret) {
		return nil, nil, api.NewError(api.PermissionDenied, api.ECredentialDenied,
			"model %s needs credential %s, which the capability token does not grant", model.Name, cr.Secret).
			WithDetail("not_started", true)
	}
	if c.kind.cfg.Secrets == nil {
		return nil, nil, api.NewError(api.ToolExecutionError, api.ECredentialUnavailable,
			"model %s needs credential %s, and no secret source is configured", model.Name, cr.Secret).WithDetail("not_started", true)
	}
	v, err := c.kind.cfg.Secrets.Lookup(cr.Secret)
	if err != nil {
		return nil, nil, api.NewError(api.ToolExecutionError, httptool.SecretECode(err),
			"model %s needs credential %s, which no secret source on this worker holds or can read", model.Name, cr.Secret).
			WithDetail("not_started", true).WithDetail("credential", cr.Secret)
	}
	h := http.Header{}
	h.Set(cr.Header, cr.Prefix+v)
	return h, httptool.NewScrubber(v, cr.Prefix+v), nil
}

// breakerConfig is an endpoint breaker's default: open at half of the last
// ten calls failing (at least three), trial after 30 s.
var breakerConfig = tools.CircuitBreaker{FailureRateThreshold: 50, SlidingWindowSize: 10, MinimumCalls: 3,
	WaitDurationSeconds: 30, HalfOpenCalls: 1}

// BreakerKey names the breaker of one endpoint of a model.
func BreakerKey(model, endpoint string) string { return "model:" + model + ":" + endpoint }

func (c *call) tryEndpoint(ctx context.Context, model *modelrouter.Model, ep string, p *Params, stream bool,
	header http.Header, scrub *httptool.Scrubber, used api.ModelUse) (modelrouter.Answer, error) {
	u, err := url.Parse(model.URL(ep))
	if err != nil {
		return modelrouter.Answer{}, api.NewError(api.ToolExecutionError, api.EModelMisconfigured, "model %s: endpoint %q: %v", model.Name, ep, err)
	}
	if err := httptool.CheckHost(c.m, c.grants, u); err != nil {
		return modelrouter.Answer{}, err
	}
	maxTokens := model.MaxOutputTokens
	if p.MaxOutputTokens > 0 {
		maxTokens = min(maxTokens, p.MaxOutputTokens)
	}
	if maxTokens, err = c.fit(model, p, maxTokens, used); err != nil {
		return modelrouter.Answer{}, err
	}
	var guard *breaker.Call
	if b := c.kind.cfg.Breakers; b != nil {
		cfg := breakerConfig
		if model.CircuitBreaker != nil {
			cfg = *model.CircuitBreaker
		}
		cfg.Key = BreakerKey(model.Name, ep)
		if guard, err = b.Acquire(ctx, &tools.Manifest{ID: cfg.Key, CircuitBreaker: &cfg}); err != nil {
			return modelrouter.Answer{}, err
		}
	}
	timeout := c.kind.cfg.EndpointTimeout
	if model.TimeoutMS > 0 {
		timeout = time.Duration(model.TimeoutMS) * time.Millisecond
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	call := modelrouter.Call{Model: model, Endpoint: ep, System: p.System, Messages: p.Messages, MaxTokens: maxTokens,
		Temperature: p.Temperature, Stream: stream, Header: header, MaxBytes: c.spec.MaxResponseBytes}
	if stream {
		progress := kind.ProgressFrom(ctx)
		var text strings.Builder
		var tokens int
		call.OnDelta = func(s string) {
			text.WriteString(s)
			tokens += modelrouter.CountText(s)
			tail := scrub.String(text.String())
			if len(tail) > 200 {
				tail = "…" + tail[len(tail)-200:]
			}
			progress.Report(min(99, float64(tokens)*100/float64(maxTokens)), tail)
		}
	}
	start := time.Now()
	ans, err := modelrouter.Do(actx, &http.Client{Transport: c.kind.cfg.Transport, CheckRedirect: noRedirect}, call)
	took := time.Since(start)
	if err != nil {
		err = c.classify(ctx, actx, model, ep, err, timeout)
	}
	ans.Content = scrub.String(ans.Content)
	guard.End(ctx, err, took)
	c.kind.record(ctx, model, c.kind.taskType(p.Task.Type), err, took, ans)
	return ans, err
}

// noRedirect: a provider API does not redirect; following one would carry
// the credential to wherever it points.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// classify turns a transport error into its api error; an api error from
// the provider's answer is kept.
func (c *call) classify(ctx, actx context.Context, model *modelrouter.Model, ep string, err error, timeout time.Duration) error {
	var te *api.Error
	if errors.As(err, &te) {
		return te
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if actx.Err() != nil {
		return api.NewError(api.Timeout, api.ETimeout, "model %s at %s did not answer within %v", model.Name, ep, timeout).AsRetryable()
	}
	return api.NewError(api.ExternalAPIError, api.EExternalUnreachable, "model %s at %s: %v", model.Name, ep, err).AsRetryable()
}
