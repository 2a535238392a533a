package builtin

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/toolgate/toolgate/api"
	"strings"
	"testing"
	"time"
)

func exprParams(e string) json.RawMessage { return mustJSON(map[string]string{"expression": e}) }

func TestMathEval(t *testing.T) {
	cases := []struct {
		expr, result string
		exact        bool
	}{
		{"1 + 2*3", "7", true},
		{"(1 + 2) * 3", "9", true},
		{"-(-3)", "3", true},
		{"+4", "4", true},
		{"7 / 2", "3.5", true},
		{"6 / 3", "2", true},
		{"1 / 3", "0.3333333333333333", false},
		{"0.1 + 0.2", "0.3", false}, // exact 3/10, which a double only approximates
		{"0.1 + 0.2 - 0.3", "0", true},
		{"10 % 3", "1", true},
		{"-7 % 3", "-1", true},
		{"7.0 % 2", "1", true},
		{"2.5 * 2", "5", true},
		{"0x1F + 0b101 + 0o7", "43", true},
		{"1_000 + 1", "1001", true},
		{"1e3", "1000", true},
		{"0x1p-2", "0.25", true},
		{"abs(-3.25)", "3.25", true},
		{"min(3, 1, 2)", "1", true},
		{"max(1.5, 2)", "2", true},
		{"floor(-7/2)", "-4", true},
		{"ceil(-7/2)", "-3", true},
		{"floor(2)", "2", true},
		{"round(2.5)", "3", true},
		{"round(-2.5)", "-3", true},
		{"round(2.4999)", "2", true},
		{"sqrt(16)", "4", false},
		{"sqrt(2)", "1.4142135623730951", false},
		{"pow(2, 10)", "1024", true},
		{"pow(2, 100)", "1267650600228229401496703205376", true},
		{"pow(2, -2)", "0.25", true},
		{"pow(4, 0.5)", "2", false},
		{"pow(0, 0)", "1", true},
		{"9007199254740993 + 0", "9007199254740993", true}, // beyond float64's exact integers
		{"1e-400 * 1e400", "1", true},
	}
	for _, c := range cases {
		m, err := run(t, mathEval, string(exprParams(c.expr)))
		if err != nil {
			t.Fatalf("%s: %v", c.expr, err)
		}
		out, _ := mathEval(context.Background(), exprParams(c.expr))
		var res struct {
			Result json.Number `json:"result"`
		}
		must(t, json.Unmarshal(out, &res))
		if string(res.Result) != c.result || m["exact"] != c.exact {
			t.Fatalf("%s = %s (exact %v), want %s (exact %v)", c.expr, res.Result, m["exact"], c.result, c.exact)
		}
	}

	bad := []struct{ expr, ecode string }{
		{"", api.EParametersInvalid},
		{"   ", api.EParametersInvalid},
		{"1 +", api.EParametersInvalid},
		{"x", api.EParametersInvalid},
		{"pi * 2", api.EParametersInvalid},
		{"true", api.EParametersInvalid},
		{`"a" + "b"`, api.EParametersInvalid},
		{"'a'", api.EParametersInvalid},
		{"2i", api.EParametersInvalid},
		{"math.Sqrt(4)", api.EParametersInvalid},
		{"os.Exit(1)", api.EParametersInvalid},
		{"exec(1)", api.EParametersInvalid},
		{"abs", api.EParametersInvalid},
		{"abs(1, 2)", api.EParametersInvalid},
		{"min()", api.EParametersInvalid},
		{"pow(2)", api.EParametersInvalid},
		{"min([]int{1}...)", api.EParametersInvalid},
		{"func() int { return 1 }()", api.EParametersInvalid},
		{"[]int{1}[0]", api.EParametersInvalid},
		{"1 << 3", api.EParametersInvalid},
		{"1 == 1", api.EParametersInvalid},
		{"^1", api.EParametersInvalid},
		{"!1", api.EParametersInvalid},
		{"*p", api.EParametersInvalid},
		{"1 ** 2", api.EParametersInvalid},
		{"1 / 0", api.EParametersInvalid},
		{"1 / (2 - 2)", api.EParametersInvalid},
		{"1 % 0", api.EParametersInvalid},
		{"1.5 % 1", api.EParametersInvalid},
		{"pow(0, -1)", api.EParametersInvalid},
		{"sqrt(-1)", api.EParametersInvalid},
		{"pow(-8, 1/3)", api.EParametersInvalid},
		{"pow(10, 0.5) * pow(1e300, 1.5)", api.EParametersInvalid}, // not finite as a double
		{"pow(2, 1e9)", api.EParameterBounds},
		{"pow(2, 5000)", api.EParameterBounds},
		{"pow(pow(2, 4000), 2)", api.EParameterBounds},
		{"1e9999999999", api.EParameterBounds},
		{"1e-9999999999", api.EParameterBounds},
		{"0x1p99999999", api.EParameterBounds},
		{strings.Repeat("9", 1300), api.EParameterBounds},
		{strings.Repeat("1+", maxExprBytes/2+1) + "1", api.EParameterBounds},
		{strings.Repeat("(", 70) + "1" + strings.Repeat(")", 70), api.EParameterBounds},
		{strings.Repeat("- ", 70) + "1", api.EParameterBounds},
		{strings.Repeat("abs(", 70) + "1" + strings.Repeat(")", 70), api.EParameterBounds},
	}
	for _, c := range bad {
		_, err := mathEval(context.Background(), exprParams(c.expr))
		wantCode(t, c.expr, err, api.InvalidParameters, c.ecode)
	}
}

func FuzzMathEval(f *testing.F) {
	for _, s := range []string{
		"1 + 2*3", "(1 + 2) * 3 / 7", "pow(2, 100)", "sqrt(2) + round(-2.5)", "min(1, max(2, 3))", "1e400 / 1e-400",
		"0x1p-1074", "x", "os.Exit(1)", "1 / 0", "pow(2, 4096)", "floor(ceil(1.5))", "-7 % 3", "1_0.5e+3",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		start := time.Now()
		out, err := mathEval(context.Background(), exprParams(expr))
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("%q took %v", expr, d)
		}
		if err != nil {
			var te *api.Error
			if !errors.As(err, &te) || te.Code != api.InvalidParameters {
				t.Fatalf("%q: error is not invalid_parameters: %v", expr, err)
			}
			return
		}
		var res struct {
			Result *json.Number `json:"result"`
			Exact  *bool        `json:"exact"`
		}
		if json.Unmarshal(out, &res) != nil || res.Result == nil || res.Exact == nil {
			t.Fatalf("%q: bad result %s", expr, out)
		}
	})
}
