package envelope

import (
	"encoding/json"
	"github.com/toolgate/toolgate/internal/redact"
	"strings"
	"testing"
)

func TestRedactKeysNumbersAndNamedValues(t *testing.T) {
	in := `{"AKIAIOSFODNN7EXAMPLE":"x","card":4111111111111111,"ssn":123456789,` +
		`"PWD":"hunter2","Pass-Word":"a","passwd":"b","Secret":"c","API-KEY":"d","apiKey":"e","token":7,` +
		`"Authorization":"f","private_key":"g","Client_Secret":"h","nested":[{"pwd":"i"}],"count":3}`
	out := string(redact.Redact(json.RawMessage(in)))
	if !json.Valid([]byte(out)) {
		t.Fatalf("not JSON: %s", out)
	}
	for _, leak := range []string{"AKIAIOSFODNN7EXAMPLE", "4111111111111111", "hunter2", `"a"`, `"b"`, `"c"`, `"d"`, `"e"`, `:7`, `"f"`, `"g"`, `"h"`, `"i"`} {
		if strings.Contains(out, leak) {
			t.Errorf("%s survived: %s", leak, out)
		}
	}
	if !strings.Contains(out, `"count":3`) {
		t.Errorf("a plain number was touched: %s", out)
	}
}
