package modeltool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/httptool"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

type secrets map[string]string

func (s secrets) Lookup(name string) (string, error) {
	if v, ok := s[name]; ok {
		return v, nil
	}
	return "", errors.New("no such secret")
}

// progress records what a streamed call reports.
type progress struct {
	mu       sync.Mutex
	messages []string
	percents []float64
}

func (p *progress) Report(pct float64, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.percents = append(p.percents, pct)
	p.messages = append(p.messages, msg)
}
func (p *progress) Checkpoint(json.RawMessage) error { return nil }
func (p *progress) Resumed() json.RawMessage         { return nil }

var _ kind.Progress = (*progress)(nil)

func entry(t *testing.T, doc string) modelrouter.Model {
	t.Helper()
	m, err := modelrouter.Decode([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newKind(ms ...modelrouter.Model) *Kind {
	// Loopback test servers are reached as IP literals, which the shared
	// transport dials as granted.
	return New(Config{Catalogue: modelrouter.NewCatalogue(ms...), Secrets: secrets{"key": "sk-unit-SECRET-42"},
		Transport: httptool.New(httptool.Config{}).Transport()})
}

var manifest = tools.Manifest{ID: "t.llm", Version: "1.0.0", Kind: "model"}.WithSpec(json.RawMessage(`{}`))

func invocation(hosts []string, secrets ...string) *envelope.Invocation {
	return &envelope.Invocation{Authz: &envelope.Authorization{Grants: envelope.Grants{Hosts: hosts, Secrets: secrets}}}
}

func run(t *testing.T, k *Kind, inv *envelope.Invocation, ctx context.Context, params string) (Result, *api.ModelUse, error) {
	t.Helper()
	fn, err := k.Prepare(manifest, inv)
	if err != nil {
		t.Fatal(err)
	}
	meter := &kind.Meter{}
	out, err := fn(kind.WithMeter(ctx, meter), json.RawMessage(params))
	var r Result
	if err == nil {
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			t.Fatal(jerr)
		}
	}
	return r, meter.Model(), err
}

// TestStreamBecomesProgress: each streamed piece is reported as progress,
// scrubbed, and the result is the whole answer with the credential the
// provider echoed removed.
func TestStreamBecomesProgress(t *testing.T) {
	for _, flavour := range []string{modelrouter.OpenAI, modelrouter.Anthropic} {
		t.Run(flavour, func(t *testing.T) {
			s := modeltest.New(t, flavour)
			s.Key = "sk-unit-SECRET-42"
			s.Answer = "one two three sk-unit-SECRET-42 four"
			k := newKind(entry(t, fmt.Sprintf(`{"name":"m","api":%q,"endpoints":[%q],"tier":"small","context_window":4000,
			  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":2},"credential":{"secret":"key"}}`, flavour, s.Base())))
			p := &progress{}
			r, use, err := run(t, k, invocation([]string{"127.0.0.1"}, "key"), kind.WithProgress(t.Context(), p),
				`{"prompt":"count","stream":true}`)
			if err != nil {
				t.Fatal(err)
			}
			if r.Content != "one two three [REDACTED] four" {
				t.Fatalf("content %q", r.Content)
			}
			if len(p.messages) != 5 || !strings.HasPrefix(p.messages[1], "one two") || p.percents[4] <= p.percents[0] {
				t.Fatalf("progress %q %v", p.messages, p.percents)
			}
			for _, m := range p.messages {
				if strings.Contains(m, "SECRET") {
					t.Fatalf("progress holds the credential: %q", m)
				}
			}
			want := modelrouter.Price{InputPer1K: 1, OutputPer1K: 2}.Cost(s.InputTokens, s.OutputTokens)
			if use.Cost != want || r.Cost != use.Cost {
				t.Fatalf("cost %v %v", use.Cost, r.Cost)
			}
		})
	}
}

// TestLoadBalancing: calls start at each instance in turn.
func TestLoadBalancing(t *testing.T) {
	a, b := modeltest.New(t, "openai"), modeltest.New(t, "openai")
	k := newKind(entry(t, fmt.Sprintf(`{"name":"m","api":"openai","endpoints":[%q,%q],"tier":"small","context_window":4000,
	  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":2}}`, a.Base(), b.Base())))
	for range 4 {
		if _, _, err := run(t, k, invocation([]string{"127.0.0.1"}), t.Context(), `{"prompt":"hi"}`); err != nil {
			t.Fatal(err)
		}
	}
	if a.Calls() != 2 || b.Calls() != 2 {
		t.Fatalf("calls %d and %d, want 2 and 2", a.Calls(), b.Calls())
	}
}

// TestHostsAndCredentialsAsForHTTPTools: an endpoint the token does not
// grant is skipped with E3104 and the chain moves on; a credential it does
// not grant is refused.
func TestHostsAndCredentialsAsForHTTPTools(t *testing.T) {
	s := modeltest.New(t, "openai")
	k := newKind(
		entry(t, `{"name":"far","api":"openai","endpoints":["http://10.255.255.1:9/v1"],"tier":"small","context_window":4000,
		  "max_output_tokens":100,"price":{"input_per_1k":0,"output_per_1k":0},"fallback":["near"]}`),
		entry(t, fmt.Sprintf(`{"name":"near","api":"openai","endpoints":[%q],"tier":"medium","context_window":4000,
		  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, s.Base())),
		entry(t, fmt.Sprintf(`{"name":"keyed","api":"openai","endpoints":[%q],"tier":"large","context_window":4000,
		  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1},"credential":{"secret":"key"}}`, s.Base())))
	r, use, err := run(t, k, invocation([]string{"127.0.0.1"}), t.Context(), `{"model":"far","prompt":"hi"}`)
	if err != nil || r.Model != "near" || use.Attempts[0].ECode != api.ENetworkPolicy {
		t.Fatalf("%v %+v %v", r.Model, use, err)
	}
	if _, _, err := run(t, k, invocation([]string{"127.0.0.1"}), t.Context(), `{"model":"keyed","prompt":"hi"}`); !isCode(err, api.ECredentialDenied) {
		t.Fatalf("got %v, want E3205", err)
	}
	if _, _, err := run(t, k, invocation([]string{"127.0.0.1"}), t.Context(), `{"prompt":"hi","colour":"red"}`); !isCode(err, api.EParametersInvalid) {
		t.Fatalf("got %v, want E3015", err)
	}
}

func isCode(err error, ecode string) bool {
	var te *api.Error
	return errors.As(err, &te) && te.ECode == ecode
}

// TestRetriesAccumulate: when the executor's retry policy runs a call
// again, what every run used is charged.
func TestRetriesAccumulate(t *testing.T) {
	s := modeltest.New(t, "openai")
	k := newKind(entry(t, fmt.Sprintf(`{"name":"m","api":"openai","endpoints":[%q],"tier":"small","context_window":4000,
	  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, s.Base())))
	fn, err := k.Prepare(manifest, invocation([]string{"127.0.0.1"}))
	if err != nil {
		t.Fatal(err)
	}
	meter := &kind.Meter{}
	ctx := kind.WithMeter(t.Context(), meter)
	for range 2 {
		if _, err := fn(ctx, json.RawMessage(`{"prompt":"hi"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if u := meter.Model(); u.InputTokens != 2*s.InputTokens || u.OutputTokens != 2*s.OutputTokens || len(u.Attempts) != 2 {
		t.Fatalf("use %+v", u)
	}
}

// TestFallbackAsTheRouterSpecifies: a request the provider calls invalid
// is not sent down the chain; transient failures (5xx, 408) are tried
// again on the same model, after a doubling delay, before the chain moves
// on; every attempt is recorded.
func TestFallbackAsTheRouterSpecifies(t *testing.T) {
	primary, backup := modeltest.New(t, "openai"), modeltest.New(t, "openai")
	k := newKind(
		entry(t, fmt.Sprintf(`{"name":"primary","api":"openai","endpoints":[%q],"tier":"small","context_window":4000,
		  "max_output_tokens":100,"price":{"input_per_1k":0,"output_per_1k":0},"fallback":["backup"],
		  "retry":{"max_attempts":3,"base_delay_ms":40}}`, primary.Base())),
		entry(t, fmt.Sprintf(`{"name":"backup","api":"openai","endpoints":[%q],"tier":"medium","context_window":4000,
		  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, backup.Base())))
	inv := invocation([]string{"127.0.0.1"})
	codes := func(u *api.ModelUse) string {
		var out []string
		for _, a := range u.Attempts {
			out = append(out, a.Model+":"+a.ECode)
		}
		return strings.Join(out, ",")
	}

	t.Run("invalid request stays on its model", func(t *testing.T) {
		primary.Set(modeltest.Invalid)
		before := backup.Calls()
		_, use, err := run(t, k, inv, t.Context(), `{"model":"primary","prompt":"hi"}`)
		if !isCode(err, api.EExternalStatus) || api.AsError(err).Details["status"] != 400 {
			t.Fatalf("got %v, want E3304 with status 400", err)
		}
		if backup.Calls() != before || len(use.Attempts) != 1 {
			t.Fatalf("an invalid request went down the chain: backup calls %d→%d, attempts %s", before, backup.Calls(), codes(use))
		}
	})

	t.Run("transient failure retried on the same model", func(t *testing.T) {
		primary.Set(modeltest.OK)
		primary.FailFirst(primary.Calls() + 2)
		before := backup.Calls()
		start := time.Now()
		r, use, err := run(t, k, inv, t.Context(), `{"model":"primary","prompt":"hi"}`)
		if err != nil || r.Model != "primary" || backup.Calls() != before {
			t.Fatalf("answered by %q (%v), backup calls %d→%d", r.Model, err, before, backup.Calls())
		}
		if got := codes(use); got != "primary:E3304,primary:E3304,primary:" {
			t.Fatalf("attempts %s", got)
		}
		if took := time.Since(start); took < 120*time.Millisecond { // 40 ms, then 80 ms
			t.Fatalf("two retries took %v: no backoff", took)
		}
	})

	t.Run("408 retried, then the chain moves on", func(t *testing.T) {
		primary.FailFirst(0)
		primary.Set(modeltest.Timeout)
		r, use, err := run(t, k, inv, t.Context(), `{"model":"primary","prompt":"hi"}`)
		if err != nil || r.Model != "backup" {
			t.Fatalf("answered by %q (%v)", r.Model, err)
		}
		if got := codes(use); got != "primary:E3304,primary:E3304,primary:E3304,backup:" {
			t.Fatalf("attempts %s", got)
		}
	})

	t.Run("no retry past the call's deadline", func(t *testing.T) {
		primary.Set(modeltest.Fail500)
		slow := newKind(
			entry(t, fmt.Sprintf(`{"name":"primary","api":"openai","endpoints":[%q],"tier":"small","context_window":4000,
			  "max_output_tokens":100,"price":{"input_per_1k":0,"output_per_1k":0},"fallback":["backup"]}`, primary.Base())),
			entry(t, fmt.Sprintf(`{"name":"backup","api":"openai","endpoints":[%q],"tier":"medium","context_window":4000,
			  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, backup.Base())))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second) // less than twice the default 2 s
		defer cancel()
		r, use, err := run(t, slow, inv, ctx, `{"model":"primary","prompt":"hi"}`)
		if err != nil || r.Model != "backup" || codes(use) != "primary:E3304,backup:" {
			t.Fatalf("answered by %q (%v), attempts %s", r.Model, err, codes(use))
		}
	})
}
