package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
)

func TestIsMatchesByCodeThroughWrapping(t *testing.T) {
	err := fmt.Errorf("resolving tool: %w", NewError(ToolNotFound, EToolNotFound, "no tool %q", "x"))
	if !errors.Is(err, ErrToolNotFound) {
		t.Fatalf("errors.Is(%v, ErrToolNotFound) = false", err)
	}
	if errors.Is(err, ErrTimeout) {
		t.Fatalf("a tool_not_found error matched ErrTimeout")
	}
	if !errors.Is(err, &Error{Code: ToolNotFound, ECode: EToolNotFound}) {
		t.Fatal("matching by code and E-code failed")
	}
	if errors.Is(err, &Error{Code: ToolNotFound, ECode: EToolRemoved}) {
		t.Fatal("a different E-code matched")
	}
}

func TestAsGivesUncodedErrorsACode(t *testing.T) {
	got := AsError(errors.New("boom"))
	if got.Code != InternalError || got.ECode != EInternal {
		t.Fatalf("As(plain error) = %+v, want internal_error/%s", got, EInternal)
	}
	if AsError(nil) != nil {
		t.Fatal("As(nil) != nil")
	}
}

func TestWireRoundTrip(t *testing.T) {
	in := NewError(InvalidParameters, EParametersInvalid, "parameters do not match the input schema").
		WithFields([]FieldError{{Location: "/n", Message: "expected integer"}}).
		WithDetail("tool_id", "echo")
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	_ = json.Unmarshal(b, &raw)
	details := raw["details"].(map[string]any)
	if details["e_code"] != EParametersInvalid || raw["code"] != string(InvalidParameters) {
		t.Fatalf("wire form lacks code or e_code: %s", b)
	}
	var out Error
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*in, out) {
		t.Fatalf("round trip changed the error:\n in %+v\nout %+v", *in, out)
	}
}

func TestNumber(t *testing.T) {
	for in, want := range map[string]int{EInvocationNotFound: 3025, ERequestInvalid: 3016, "": 0, "E": 0, "3016": 0, "Exyz": 0, "E-1": 0} {
		if got := Number(in); got != want {
			t.Errorf("Number(%q) = %d, want %d", in, got, want)
		}
	}
}
