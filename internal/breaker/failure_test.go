package breaker

import (
	"errors"
	"github.com/toolgate/toolgate/api"
	"testing"
)

func TestCountsAsFailure(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"success", nil, false},
		{"tool failed", api.NewError(api.ToolExecutionError, api.EToolFailed, "x"), true},
		{"timeout", api.NewError(api.Timeout, api.ETimeout, "x"), true},
		{"sandbox limit", api.NewError(api.SandboxFailure, api.EResourceLimit, "x"), true},
		{"upstream 503", api.NewError(api.ExternalAPIError, "E3304", "503").AsRetryable(), true},
		{"upstream 404", api.NewError(api.ExternalAPIError, "E3304", "404"), false},
		{"caller's bad parameters", api.NewError(api.InvalidParameters, api.EParametersInvalid, "x"), false},
		{"plain error", errors.New("boom"), true},
	}
	for _, c := range cases {
		if got := countsAsFailure(c.err); got != c.want {
			t.Errorf("%s: countsAsFailure = %v, want %v", c.name, got, c.want)
		}
	}
}
