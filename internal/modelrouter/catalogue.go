// Package modelrouter chooses a model for a request and talks to it: the
// catalogue entry of a model, the routing decision (complexity classified
// by rules held as data, constraints, a policy), token counting with an
// offline tokenizer, context-window fitting, and the wire formats of the
// OpenAI chat completions and Anthropic Messages APIs, streamed or not.
//
// It neither dials nor holds credentials: the model kind
// (stages/execute/modeltool) supplies an http.Client, headers and the
// fallback loop.
package modelrouter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/schemas"
)

// API flavours.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
)

// Tiers, smallest first.
var Tiers = []string{"small", "medium", "large"}

// Model is one catalogue entry, stored in the models bucket under Name.
type Model struct {
	// Name is the catalogue name requests use.
	Name string `json:"name"`
	// API is the provider's wire format: openai or anthropic.
	API string `json:"api"`
	// UpstreamModel is the model name sent to the provider; default Name.
	UpstreamModel string `json:"upstream_model,omitempty"`
	// Endpoints are the model's instances; calls are spread across them
	// and move to the next when one fails. Each is the API's base URL
	// (…/v1); the flavour's path is appended.
	Endpoints []string `json:"endpoints"`
	// Tier is small, medium or large.
	Tier string `json:"tier"`
	// ContextWindow is the most tokens, input and output together.
	ContextWindow int `json:"context_window"`
	// MaxOutputTokens bounds an answer; default 1024.
	MaxOutputTokens int `json:"max_output_tokens,omitempty"`
	// Price is per 1,000 tokens.
	Price Price `json:"price"`
	// TimeoutMS bounds one call to one endpoint; a call that takes longer
	// moves down the chain. Default: the model kind's (60 s).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// LatencyMS is the typical time to a full answer.
	LatencyMS int64 `json:"latency_ms,omitempty"`
	// Capabilities are tags such as code, vision, tools, long_context.
	Capabilities []string `json:"capabilities,omitempty"`
	// Credential names the secret sent with every request, as for http
	// tools; absent for a provider that needs none.
	Credential *Credential `json:"credential,omitempty"`
	// Fallback names the models tried, in order, when this one fails.
	Fallback []string `json:"fallback,omitempty"`
	// CircuitBreaker configures each endpoint's breaker; default one that
	// opens at half the last ten calls failing and waits 30 s.
	CircuitBreaker *tools.CircuitBreaker `json:"circuit_breaker,omitempty"`
	// Retry is how often a transient failure is tried again on this model
	// before the chain moves on; default DefaultRetry.
	Retry *Retry `json:"retry,omitempty"`
}

// Retry bounds the rounds over a model's endpoints: a round that fails
// with a transient error (a timeout, 408, 429, 5xx, a broken connection)
// is followed by another after BaseDelayMS, doubled each time, until
// MaxAttempts rounds have run.
type Retry struct {
	MaxAttempts int   `json:"max_attempts,omitempty"`
	BaseDelayMS int64 `json:"base_delay_ms,omitempty"`
}

// DefaultRetry is the model router specification's: three retries after
// 2, 4 and 8 seconds.
var DefaultRetry = Retry{MaxAttempts: 4, BaseDelayMS: 2000}

// RetryPolicy is the model's retry policy, its members defaulted.
func (m *Model) RetryPolicy() Retry {
	r := DefaultRetry
	if m.Retry != nil {
		if m.Retry.MaxAttempts > 0 {
			r.MaxAttempts = m.Retry.MaxAttempts
		}
		if m.Retry.BaseDelayMS > 0 {
			r.BaseDelayMS = m.Retry.BaseDelayMS
		}
	}
	return r
}

// Price is the cost of 1,000 tokens.
type Price struct {
	InputPer1K  float64 `json:"input_per_1k"`
	OutputPer1K float64 `json:"output_per_1k"`
}

// Cost prices a call's tokens.
func (p Price) Cost(in, out int64) float64 {
	return float64(in)/1000*p.InputPer1K + float64(out)/1000*p.OutputPer1K
}

// Credential puts a secret into a request header: Prefix + value. The
// default header is the flavour's: Authorization with "Bearer " for
// openai, x-api-key for anthropic.
type Credential struct {
	Secret string `json:"secret"`
	Header string `json:"header,omitempty"`
	Prefix string `json:"prefix,omitempty"`
}

// ErrInvalid marks a catalogue entry that cannot be used.
var ErrInvalid = errors.New("invalid model")

// Normalize fills defaults and checks the entry.
func (m *Model) Normalize() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w %q: %s", ErrInvalid, m.Name, fmt.Sprintf(format, args...))
	}
	if m.Name == "" || strings.ContainsAny(m.Name, " */>") {
		return bad("name must be non-empty without spaces, '*', '/' or '>'")
	}
	if m.API != OpenAI && m.API != Anthropic {
		return bad("api %q is not openai or anthropic", m.API)
	}
	if len(m.Endpoints) == 0 {
		return bad("no endpoints")
	}
	for _, e := range m.Endpoints {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("endpoint %q is not an absolute http(s) URL", e)
		}
		// A password in the URL would be sent with every call and shown
		// wherever the endpoint is (results, audit, models list).
		if u.User != nil {
			return bad("endpoint %s: user information in URLs is refused; give the key as a credential secret", u.Redacted())
		}
	}
	if !slices.Contains(Tiers, m.Tier) {
		return bad("tier %q is not one of %v", m.Tier, Tiers)
	}
	if m.ContextWindow <= 0 {
		return bad("context_window must be positive")
	}
	if m.MaxOutputTokens == 0 {
		m.MaxOutputTokens = 1024
	}
	if m.MaxOutputTokens < 0 || m.MaxOutputTokens >= m.ContextWindow {
		return bad("max_output_tokens must be positive and below the context window")
	}
	if m.Price.InputPer1K < 0 || m.Price.OutputPer1K < 0 || m.LatencyMS < 0 {
		return bad("prices and latency must not be negative")
	}
	if m.UpstreamModel == "" {
		m.UpstreamModel = m.Name
	}
	if c := m.Credential; c != nil {
		if c.Secret == "" {
			return bad("credential names no secret")
		}
		if c.Header == "" {
			if m.API == OpenAI {
				c.Header, c.Prefix = "Authorization", "Bearer "
			} else {
				c.Header = "x-api-key"
			}
		}
	}
	if slices.Contains(m.Fallback, m.Name) {
		return bad("falls back to itself")
	}
	return nil
}

// Decode reads and checks one catalogue entry against
// schemas/model.schema.json and Normalize.
func Decode(data []byte) (Model, error) {
	fields, err := schemas.Validate(schemas.Model(), data)
	if err != nil {
		return Model{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(fields) > 0 {
		msgs := make([]string, 0, len(fields))
		for _, f := range fields {
			msgs = append(msgs, f.Location+": "+f.Message)
		}
		return Model{}, fmt.Errorf("%w: %s", ErrInvalid, strings.Join(msgs, "; "))
	}
	var m Model
	if err := json.Unmarshal(data, &m); err != nil {
		return Model{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return m, m.Normalize()
}

// tierIndex is a tier's rank, -1 for none.
func tierIndex(t string) int { return slices.Index(Tiers, t) }

// Catalogue is the models a worker knows, kept in step with the models
// bucket by a watch. It is safe for concurrent use.
type Catalogue struct {
	mu     sync.RWMutex
	models map[string]*Model
	ranker Ranker
	// rankErr is why the last routing policy stored was not taken.
	rankErr error
}

// RoutingKey is the models bucket's key of the routing policy (Rego); no
// model name can take it.
const RoutingKey = "_routing"

// SetRouting compiles a routing policy and uses it from now on; empty
// src restores the shipped one. A policy that does not compile is refused
// and the one in use kept.
func (c *Catalogue) SetRouting(ctx context.Context, src string) error {
	r, err := NewRegoRanker(ctx, src)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rankErr = err
	if err == nil {
		c.ranker = r
	}
	return err
}

// Ranker returns the routing policy in use (nil before SetRouting) and
// why the latest one stored was refused.
func (c *Catalogue) Ranker() (Ranker, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.ranker, c.rankErr
}

// NewCatalogue returns a catalogue holding ms.
func NewCatalogue(ms ...Model) *Catalogue {
	c := &Catalogue{models: map[string]*Model{}}
	for _, m := range ms {
		c.Put(m)
	}
	return c
}

// Put adds or replaces a model.
func (c *Catalogue) Put(m Model) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.models == nil {
		c.models = map[string]*Model{}
	}
	// A new map each time: Snapshot hands maps out without copying.
	next := make(map[string]*Model, len(c.models)+1)
	maps.Copy(next, c.models)
	next[m.Name] = &m
	c.models = next
}

// Delete removes a model.
func (c *Catalogue) Delete(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := maps.Clone(c.models)
	delete(next, name)
	c.models = next
}

// Snapshot returns the models by name; the map must not be changed.
func (c *Catalogue) Snapshot() map[string]*Model {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.models
}
