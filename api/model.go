package api

import "time"

// ModelUse is what a call of a model tool used and how its model was
// chosen. The execute stage records it in ExecutionMetadata.Model; the
// session is charged its tokens and cost when the call ends.
type ModelUse struct {
	// Model is the catalogue name of the model that answered (or was last
	// tried), Endpoint the instance's URL.
	Model    string `json:"model"`
	Endpoint string `json:"endpoint,omitempty"`
	// InputTokens and OutputTokens are the provider's counts, or toolgate's
	// own count when the answer carried none (a stream cut mid-way).
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// Cost is the tokens priced at the catalogue's rates, summed over
	// every attempt that reached a provider.
	Cost float64 `json:"cost"`
	// Routing is the routing decision.
	Routing *Routing `json:"routing,omitempty"`
	// Attempts lists every model and endpoint tried, in order.
	Attempts []ModelAttempt `json:"attempts,omitempty"`
}

// Tokens is the input and output tokens together.
func (u *ModelUse) Tokens() int64 { return u.InputTokens + u.OutputTokens }

// Routing is how the router chose: the policy, the complexity class, the
// tier asked for, the chosen model, the fallback chain and every candidate
// considered with the reason it was not chosen.
type Routing struct {
	Policy     string      `json:"policy"`
	Complexity string      `json:"complexity,omitempty"`
	Tier       string      `json:"tier,omitempty"`
	Chosen     string      `json:"chosen"`
	Chain      []string    `json:"chain"`
	Considered []Candidate `json:"considered"`
	// InputTokens is the request's size as counted before the call.
	InputTokens int `json:"input_tokens"`
	// Truncated is the strategy applied to make the request fit, if any.
	Truncated  string `json:"truncated,omitempty"`
	DecisionNS int64  `json:"decision_ns"`
}

// Candidate is one model the router looked at.
type Candidate struct {
	Model  string  `json:"model"`
	Score  float64 `json:"score,omitempty"`
	Reason string  `json:"reason,omitempty"` // why it was left out; empty when eligible
	// Observed is what the cluster recently saw of the model's calls, when
	// there were enough to route by (toolgate models stats).
	Observed *ModelObserved `json:"observed,omitempty"`
}

// ModelObserved is the part of a model's recent statistics routing used.
type ModelObserved struct {
	Calls       int64   `json:"calls"`
	SuccessRate float64 `json:"success_rate"`
	P50MS       float64 `json:"p50_ms"`
}

// ModelAttempt is one call to one endpoint.
type ModelAttempt struct {
	Model    string `json:"model"`
	Endpoint string `json:"endpoint,omitempty"`
	ECode    string `json:"ecode,omitempty"`
	Error    string `json:"error,omitempty"`
	MS       int64  `json:"ms"`
}

// BudgetLimits are a session budget's caps (the token's budget claim);
// zero is unlimited.
type BudgetLimits struct {
	MaxCalls     int64   `json:"max_calls,omitempty"`
	MaxRuntimeMS int64   `json:"max_runtime_ms,omitempty"`
	MaxCost      float64 `json:"max_cost,omitempty"`
	MaxTokens    int64   `json:"max_tokens,omitempty"`
}

// BudgetStatus is where a session's budget stands: what is used and remains, the spending rate since
// the first charge, and when, at that rate, the first cap is reached.
type BudgetStatus struct {
	Tenant  string       `json:"tenant"`
	Session string       `json:"session"`
	Limits  BudgetLimits `json:"limits"`
	Used    struct {
		Calls     int64   `json:"calls"`
		RuntimeMS int64   `json:"runtime_ms"`
		Cost      float64 `json:"cost"`
		Tokens    int64   `json:"tokens"`
	} `json:"used"`
	// Remaining holds only the capped quantities.
	Remaining map[string]float64 `json:"remaining,omitempty"`
	// PerHour is the spending rate of each quantity.
	PerHour map[string]float64 `json:"per_hour,omitempty"`
	// Depletes is when the first capped quantity runs out at PerHour, and
	// DepletesFirst which one; empty when nothing is capped or spent.
	Depletes      string `json:"depletes,omitempty"`
	DepletesFirst string `json:"depletes_first,omitempty"`
	// Exhausted names the quantities already at their cap.
	Exhausted []string `json:"exhausted,omitempty"`
}

// BudgetRequest asks where a session's budget stands (the control
// service's budget endpoint). Limits are the budget claim's caps, which
// the session's usage record does not hold.
type BudgetRequest struct {
	TenantID string       `json:"tenant_id"`
	Session  string       `json:"session"`
	Limits   BudgetLimits `json:"limits,omitzero"`
}

// ModelStats is what the cluster has recently seen of one model's calls
// for one task type: every call to an
// endpoint of the model, fallback attempts included, merged from each
// execute process's share of the model statistics bucket.
type ModelStats struct {
	Model string `json:"model"`
	// TaskType is the calls' task type: one the routing rules score,
	// "other" for one they do not, "none" for calls naming none, "*" for
	// every task type together (ModelStatsRequest.ByModel).
	TaskType    string  `json:"task_type"`
	Calls       int64   `json:"calls"`
	Successes   int64   `json:"successes"`
	SuccessRate float64 `json:"success_rate"`
	// Failures counts failed calls by class: timeout, rate_limited,
	// server_error, client_error, auth, unreachable, bad_answer, other.
	Failures map[string]int64 `json:"failures,omitempty"`
	// Latency in milliseconds: the mean, and percentiles as the upper bound
	// of the histogram bucket they fall in (buckets about 19% wide).
	MeanMS       float64 `json:"mean_ms"`
	P50MS        float64 `json:"p50_ms"`
	P95MS        float64 `json:"p95_ms"`
	P99MS        float64 `json:"p99_ms"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	Cost         float64 `json:"cost"`
	AvgCost      float64 `json:"avg_cost"`
	// LastCall is when a shard last recorded a call.
	LastCall time.Time `json:"last_call,omitzero"`
}

// ModelStatsRequest asks for model statistics, filtered by model and task
// type when they are set; ByModel merges each model's task types.
type ModelStatsRequest struct {
	Model    string `json:"model,omitempty"`
	TaskType string `json:"task_type,omitempty"`
	ByModel  bool   `json:"by_model,omitempty"`
}

// ModelStatsResponse lists model statistics by model, then task type.
type ModelStatsResponse struct {
	Models []ModelStats `json:"models"`
	// WindowSeconds is the bucket's max age: the statistics are those of
	// calls recorded within it.
	WindowSeconds int64 `json:"window_seconds"`
}
