package modelrouter

import (
	"errors"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	m, err := Decode([]byte(`{"name":"gpt","api":"openai","endpoints":["https://api.openai.com/v1"],"tier":"small",
	  "context_window":16000,"price":{"input_per_1k":0.1,"output_per_1k":0.2},"credential":{"secret":"openai_key"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.UpstreamModel != "gpt" || m.MaxOutputTokens != 1024 || m.Credential.Header != "Authorization" || m.Credential.Prefix != "Bearer " {
		t.Fatalf("defaults not filled: %+v %+v", m, m.Credential)
	}
	for name, doc := range map[string]string{
		"unknown api":     `{"name":"a","api":"gemini","endpoints":["https://x/v1"],"tier":"small","context_window":10,"price":{"input_per_1k":0,"output_per_1k":0}}`,
		"no endpoints":    `{"name":"a","api":"openai","endpoints":[],"tier":"small","context_window":10,"price":{"input_per_1k":0,"output_per_1k":0}}`,
		"bad endpoint":    `{"name":"a","api":"openai","endpoints":["ftp://x"],"tier":"small","context_window":10,"price":{"input_per_1k":0,"output_per_1k":0}}`,
		"unknown tier":    `{"name":"a","api":"openai","endpoints":["https://x/v1"],"tier":"huge","context_window":10,"price":{"input_per_1k":0,"output_per_1k":0}}`,
		"unknown field":   `{"name":"a","api":"openai","endpoints":["https://x/v1"],"tier":"small","context_window":10,"price":{"input_per_1k":0,"output_per_1k":0},"colour":"red"}`,
		"own fallback":    `{"name":"a","api":"openai","endpoints":["https://x/v1"],"tier":"small","context_window":2000,"price":{"input_per_1k":0,"output_per_1k":0},"fallback":["a"]}`,
		"output > window": `{"name":"a","api":"openai","endpoints":["https://x/v1"],"tier":"small","context_window":100,"max_output_tokens":100,"price":{"input_per_1k":0,"output_per_1k":0}}`,
		"negative price":  `{"name":"a","api":"openai","endpoints":["https://x/v1"],"tier":"small","context_window":2000,"price":{"input_per_1k":-1,"output_per_1k":0}}`,
		"not JSON":        `{`,
		"password in URL": `{"name":"a","api":"openai","endpoints":["https://u:hunter2@x/v1"],"tier":"small","context_window":2000,"price":{"input_per_1k":0,"output_per_1k":0}}`,
	} {
		_, err := Decode([]byte(doc))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the refusal shows the password: %v", name, err)
		}
	}
}
