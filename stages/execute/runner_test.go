package execute

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

// TestRunnerSharedByCalls: the calls of one tool under one retry policy
// (a copy per call, as a tenant's defaults are) and one limit share a
// runner, whose executions keep their own attempts when they run at
// once; another limit or policy has its own.
func TestRunnerSharedByCalls(t *testing.T) {
	x := &Executor{}
	m := &tools.Manifest{ID: "flaky", Version: "1.0.0", Kind: "builtin", Safety: tools.Safety{Idempotent: true}}
	policy := func() *tools.RetryPolicy { return &tools.RetryPolicy{MaxAttempts: 3, BaseDelayMS: 1, MaxDelayMS: 2} }
	r := x.runner(m, policy(), time.Second)
	if x.runner(m, policy(), time.Second) != r {
		t.Fatal("a copy of the same policy built another runner")
	}
	if x.runner(m, policy(), 2*time.Second) == r || x.runner(m, nil, time.Second) == r ||
		x.runner(m, &tools.RetryPolicy{MaxAttempts: 4, BaseDelayMS: 1, MaxDelayMS: 2}, time.Second) == r {
		t.Fatal("another limit or policy shares the runner")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			failures := 2
			got, err := r.WithContext(context.Background()).GetWithExecution(func(exec failsafe.Execution[json.RawMessage]) (json.RawMessage, error) {
				if failures > 0 {
					failures--
					return nil, api.NewError(api.Timeout, api.ETimeout, "slow")
				}
				if exec.Attempts() != 3 {
					t.Errorf("attempt %d succeeded, want the third", exec.Attempts())
				}
				return json.RawMessage(`{}`), nil
			})
			if err != nil || string(got) != `{}` {
				t.Errorf("%s, %v", got, err)
			}
		}()
	}
	wg.Wait()
	// The limit holds for each call of the shared runner.
	_, err := x.runner(m, nil, 20*time.Millisecond).WithContext(context.Background()).Get(func() (json.RawMessage, error) {
		time.Sleep(200 * time.Millisecond)
		return nil, nil
	})
	if err == nil {
		t.Fatal("a call over its limit succeeded")
	}
}
