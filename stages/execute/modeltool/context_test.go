package modeltool

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
)

// longConversation is 30 messages of about 45 tokens, with one fact in
// message 12 that the last question asks about.
func longConversation(question string) string {
	var msgs []string
	for i := range 30 {
		c := fmt.Sprintf("message %d: %s", i, strings.Repeat("we talked about the weather. ", 8))
		if i == 12 {
			c += "The launch code is 5521."
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, c))
	}
	msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":%q}`, question))
	return "[" + strings.Join(msgs, ",") + "]"
}

// sent is the messages of the last request a test server received.
func sent(s *modeltest.Server) []map[string]any {
	var out []map[string]any
	for _, m := range s.Last()["messages"].([]any) {
		out = append(out, m.(map[string]any))
	}
	return out
}

// TestContextStrategies: a call larger than every window it may use is
// refused unless it names a strategy; each strategy makes it fit in its own
// way, and every call it takes is charged.
func TestContextStrategies(t *testing.T) {
	s := modeltest.New(t, "openai")
	k := newKind(entry(t, fmt.Sprintf(`{"name":"tiny","api":"openai","endpoints":[%q],"tier":"small","context_window":600,
	  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, s.Base())))
	inv := invocation([]string{"127.0.0.1"})
	params := func(truncate string) string {
		return fmt.Sprintf(`{"truncate":%q,"messages":%s}`, truncate, longConversation("What is the launch code?"))
	}
	if _, _, err := run(t, k, inv, t.Context(), params("none")); !isCode(err, api.EModelContextWindow) {
		t.Fatalf("no strategy: %v", err)
	}

	t.Run("retrieve", func(t *testing.T) {
		before := s.Calls()
		_, use, err := run(t, k, inv, t.Context(), params(modelrouter.TruncateRetrieve))
		if err != nil {
			t.Fatal(err)
		}
		msgs := sent(s)
		c, _ := msgs[len(msgs)-1]["content"].(string)
		if s.Calls()-before != 1 || len(msgs) != 1 || !strings.Contains(c, "The launch code is 5521.") || !strings.HasSuffix(c, "What is the launch code?") {
			t.Fatalf("%d calls, sent %v", s.Calls()-before, msgs)
		}
		if use.Routing.Truncated != modelrouter.TruncateRetrieve || use.Routing.InputTokens > 420 {
			t.Fatalf("routing %+v", use.Routing)
		}
	})

	t.Run("summarize", func(t *testing.T) {
		s.Answer = "SUMMARY: the weather, and the launch code 5521."
		defer func() { s.Answer = "Hello from openai" }()
		before := s.Calls()
		r, use, err := run(t, k, inv, t.Context(), params(modelrouter.TruncateSummarize))
		if err != nil {
			t.Fatal(err)
		}
		calls := s.Calls() - before
		msgs := sent(s)
		first, _ := msgs[0]["content"].(string)
		last, _ := msgs[len(msgs)-1]["content"].(string)
		if calls < 2 || !strings.HasPrefix(first, "Summary of the earlier conversation:") || !strings.Contains(first, "SUMMARY:") ||
			last != "What is the launch code?" {
			t.Fatalf("%d calls; sent %v", calls, msgs)
		}
		// Every call is charged: the summaries' and the answer's.
		if use.InputTokens != calls*s.InputTokens || len(use.Attempts) != int(calls) || r.Cost != use.Cost {
			t.Fatalf("use %+v, result cost %v", use, r.Cost)
		}
	})

	t.Run("split", func(t *testing.T) {
		long := strings.Repeat("A line of a long document to be read in parts. ", 150)
		before := s.Calls()
		r, use, err := run(t, k, inv, t.Context(), fmt.Sprintf(`{"truncate":"split","system":"count the lines","messages":[{"role":"user","content":%q}]}`, long))
		if err != nil {
			t.Fatal(err)
		}
		calls := s.Calls() - before
		if calls < 3 || r.Parts != int(calls) || strings.Count(r.Content, "Hello from openai") != int(calls) {
			t.Fatalf("%d calls, result %+v", calls, r)
		}
		if r.Usage.InputTokens != calls*s.InputTokens || use.InputTokens != calls*s.InputTokens {
			t.Fatalf("usage %+v, use %+v", r.Usage, use)
		}
		msgs := sent(s)
		if c, _ := msgs[len(msgs)-1]["content"].(string); !strings.HasPrefix(c, fmt.Sprintf("[Part %d of %d", calls, calls)) {
			t.Fatalf("last part sent %q", c)
		}
	})

	t.Run("unknown strategy", func(t *testing.T) {
		if _, _, err := run(t, k, inv, t.Context(), params("compress")); !isCode(err, api.EParametersInvalid) {
			t.Fatalf("%v", err)
		}
	})
}
