package execute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
	"github.com/toolgate/toolgate/stages/execute/kind"
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

// TestRunOnceAsTheRunner: a call no retry policy applies to, run without
// failsafe-go, ends as the runner of its limit alone ends it: the tool's
// own outcome when it returns in time, timeout.ErrExceeded past the limit
// (a tool that ignores its context included), the caller's cancel seen by
// the tool.
func TestRunOnceAsTheRunner(t *testing.T) {
	x := &Executor{}
	m := &tools.Manifest{ID: "once", Version: "1.0.0", Kind: "builtin"}
	const limit = 40 * time.Millisecond
	boom := errors.New("boom")
	cases := map[string]kind.Func{
		"returns": func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(`{"ok":1}`), nil
		},
		"fails":  func(context.Context, json.RawMessage) (json.RawMessage, error) { return nil, boom },
		"panics": func(context.Context, json.RawMessage) (json.RawMessage, error) { panic("no") },
		"waits for its context": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
		"ignores its context": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			time.Sleep(3 * limit)
			if ctx.Err() == nil {
				return nil, errors.New("context not cancelled at the limit")
			}
			return json.RawMessage(`{"late":1}`), nil
		},
		"cancelled by the caller": func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			<-ctx.Done()
			return json.RawMessage(`{"stopped":1}`), context.Cause(ctx)
		},
	}
	for name, fn := range cases {
		t.Run(name, func(t *testing.T) {
			run := func(once bool) (json.RawMessage, error) {
				ctx, cancel := context.WithCancelCause(context.Background())
				defer cancel(nil)
				if name == "cancelled by the caller" {
					time.AfterFunc(limit/4, func() { cancel(ErrCancelRequested) })
				}
				if once {
					return runOnce(ctx, limit, fn, nil)
				}
				return x.runner(m, nil, limit).WithContext(ctx).GetWithExecution(func(exec failsafe.Execution[json.RawMessage]) (json.RawMessage, error) {
					return call(exec.Context(), fn, nil)
				})
			}
			want, wantErr := run(false)
			got, err := run(true)
			if string(got) != string(want) || fmt.Sprint(err) != fmt.Sprint(wantErr) ||
				errors.Is(err, timeout.ErrExceeded) != errors.Is(wantErr, timeout.ErrExceeded) || errors.Is(err, errPanic) != errors.Is(wantErr, errPanic) {
				t.Fatalf("runOnce: %s, %v; the runner: %s, %v", got, err, want, wantErr)
			}
		})
	}
}
