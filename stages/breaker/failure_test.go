package breaker

import (
	"errors"
	"testing"

	"github.com/toolgate/toolgate/stages/toolerr"
)

func TestCountsAsFailure(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"success", nil, false},
		{"tool failed", toolerr.New(toolerr.ToolExecutionError, toolerr.EToolFailed, "x"), true},
		{"timeout", toolerr.New(toolerr.Timeout, toolerr.ETimeout, "x"), true},
		{"sandbox limit", toolerr.New(toolerr.SandboxFailure, toolerr.EResourceLimit, "x"), true},
		{"upstream 503", toolerr.New(toolerr.ExternalAPIError, "E3304", "503").AsRetryable(), true},
		{"upstream 404", toolerr.New(toolerr.ExternalAPIError, "E3304", "404"), false},
		{"caller's bad parameters", toolerr.New(toolerr.InvalidParameters, toolerr.EParametersInvalid, "x"), false},
		{"plain error", errors.New("boom"), true},
	}
	for _, c := range cases {
		if got := countsAsFailure(c.err); got != c.want {
			t.Errorf("%s: countsAsFailure = %v, want %v", c.name, got, c.want)
		}
	}
}
