package modeltool

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/toolgate/toolgate/internal/modelrouter/modeltest"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// saved records the checkpoints a run saves and hands one back as the state
// it resumes from.
type saved struct {
	mu      sync.Mutex
	states  []json.RawMessage
	resumed json.RawMessage
}

func (s *saved) Report(float64, string) {}
func (s *saved) Checkpoint(state json.RawMessage) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.states = append(s.states, append(json.RawMessage(nil), state...))
	return nil
}
func (s *saved) Resumed() json.RawMessage { return s.resumed }

// partsSent is the part numbers ("[Part i of n") of the requests s received
// from the from-th on.
func partsSent(s *modeltest.Server, from int) []string {
	var out []string
	for _, req := range s.Requests()[from:] {
		msgs := req["messages"].([]any)
		c, _ := msgs[len(msgs)-1].(map[string]any)["content"].(string)
		head, _, _ := strings.Cut(strings.TrimPrefix(c, "[Part "), " of a long input")
		out = append(out, head)
	}
	return out
}

// TestSplitCheckpointsEachPart: a split call saves the answers so far after
// each part but the last; a run resumed from the k-th checkpoint sends only
// the parts after k and answers as the whole run did; a resumed state of
// other parts is not used.
func TestSplitCheckpointsEachPart(t *testing.T) {
	s := modeltest.New(t, "openai")
	k := newKind(entry(t, fmt.Sprintf(`{"name":"tiny","api":"openai","endpoints":[%q],"tier":"small","context_window":600,
	  "max_output_tokens":100,"price":{"input_per_1k":1,"output_per_1k":1}}`, s.Base())))
	inv := invocation([]string{"127.0.0.1"})
	long := strings.Repeat("A line of a long document to be read in parts. ", 150)
	params := fmt.Sprintf(`{"truncate":"split","system":"count the lines","messages":[{"role":"user","content":%q}]}`, long)
	call := func(p *saved) Result {
		t.Helper()
		r, _, err := run(t, k, inv, kind.WithProgress(context.Background(), p), params)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := &saved{}
	whole := call(first)
	n := whole.Parts
	if n < 3 || int(s.Calls()) != n || len(first.states) != n-1 || whole.ResumedParts != 0 {
		t.Fatalf("%d parts, %d calls, %d checkpoints", n, s.Calls(), len(first.states))
	}
	for k := 1; k < n; k++ {
		before := len(s.Requests())
		again := &saved{resumed: first.states[k-1]}
		r := call(again)
		var want []string
		for i := k + 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("%d of %d", i, n))
		}
		if got := partsSent(s, before); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("resumed after part %d: sent parts %q, want %q", k, got, want)
		}
		if r.ResumedParts != k || r.Content != whole.Content || r.Usage != whole.Usage || r.Cost != whole.Cost {
			t.Fatalf("resumed after part %d: %+v, want %+v", k, r, whole)
		}
		if len(again.states) != n-1-k {
			t.Fatalf("resumed after part %d: %d checkpoints, want %d", k, len(again.states), n-1-k)
		}
	}
	// Another document's progress: every part is sent.
	other := strings.Replace(string(first.states[0]), `"digest":"`, `"digest":"0`, 1)
	before := len(s.Requests())
	if r := call(&saved{resumed: json.RawMessage(other)}); r.ResumedParts != 0 || len(s.Requests())-before != n {
		t.Fatalf("resumed from other parts: %+v, %d requests", r, len(s.Requests())-before)
	}
}
