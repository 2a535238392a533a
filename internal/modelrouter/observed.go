package modelrouter

import (
	"context"
	"errors"

	"github.com/toolgate/toolgate/api"
)

// MinObservedCalls is how many recent calls a model needs before routing
// trusts what was observed of it over the catalogue: its observed median
// latency replaces latency_ms (latency-first, max_latency_ms), and its
// success rate may demote it.
const MinObservedCalls = 20

// UnreliableBelow is the observed success rate under which the shipped
// routing policy (and the Go ranking that mirrors it) ranks a model after
// every reliable one.
const UnreliableBelow = 0.8

// Observed is what the cluster has recently seen of a model's calls (the
// model statistics bucket, merged over every execute process): the number
// of calls, the share that succeeded and latency percentiles in ms.
type Observed struct {
	Calls       int64
	SuccessRate float64
	P50MS       float64
	P95MS       float64
}

// usable reports whether o has enough calls to be trusted.
func (o Observed) usable() bool { return o.Calls >= MinObservedCalls }

// observed returns what req knows of m, when it is enough to route by.
func (req *Request) observed(m *Model) (Observed, bool) {
	if req.Observe == nil {
		return Observed{}, false
	}
	o, ok := req.Observe(m.Name)
	if !ok || !o.usable() {
		return Observed{}, false
	}
	return o, true
}

// latency is the latency routing uses for m: the observed median when
// there are enough calls, else the catalogue's typical latency.
func (req *Request) latency(m *Model) int64 {
	if o, ok := req.observed(m); ok {
		return int64(o.P50MS)
	}
	return m.LatencyMS
}

// unreliable reports whether m's observed success rate demotes it.
func (req *Request) unreliable(m *Model) bool {
	o, ok := req.observed(m)
	return ok && o.SuccessRate < UnreliableBelow
}

// successRate is m's observed success rate, 1 when unknown.
func (req *Request) successRate(m *Model) float64 {
	if o, ok := req.observed(m); ok {
		return o.SuccessRate
	}
	return 1
}

// Failure classes of a model call, as the statistics count them.
const (
	FailTimeout     = "timeout"      // no answer within the endpoint's time (E3103)
	FailRateLimited = "rate_limited" // 429 (E3303)
	FailServer      = "server_error" // 5xx, 529, an error reported mid-stream (E3304)
	FailClient      = "client_error" // another 4xx (E3304)
	FailAuth        = "auth"         // 401, 403 (E3307)
	FailUnreachable = "unreachable"  // connection refused or broken off (E3306)
	FailBadAnswer   = "bad_answer"   // not the wire format, too large, stream cut (E3853-E3855)
	FailOther       = "other"
)

// FailureClasses lists the classes, for decoders and documentation.
var FailureClasses = []string{FailTimeout, FailRateLimited, FailServer, FailClient, FailAuth, FailUnreachable, FailBadAnswer, FailOther}

// FailureClass is the class of a call's error; "" for success.
func FailureClass(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return FailTimeout
	}
	var te *api.Error
	if !errors.As(err, &te) {
		return FailOther
	}
	switch te.ECode {
	case api.ETimeout:
		return FailTimeout
	case api.ERateLimited:
		return FailRateLimited
	case api.EExternalAuth:
		return FailAuth
	case api.EExternalUnreachable:
		return FailUnreachable
	case api.EModelMalformed, api.EModelAnswerTooLarge, api.EModelStreamCut, api.EExternalMalformed:
		return FailBadAnswer
	case api.EExternalStatus:
		if code, ok := te.Details["status"].(int); ok && code < 500 && code != 529 {
			return FailClient
		}
		return FailServer
	}
	return FailOther
}

// Outcome is one call to one endpoint of a model, as the statistics
// record it.
type Outcome struct {
	// Failure is the call's failure class; "" for success.
	Failure      string
	LatencyMS    int64
	InputTokens  int64
	OutputTokens int64
	Cost         float64
}
