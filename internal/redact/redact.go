package redact

import (
	"bytes"
	"encoding/json"
	"github.com/toolgate/toolgate/internal/detect"
	"regexp"
	"strings"
)

// Redacted replaces a value that must not leave toolgate.
const Redacted = "[REDACTED]"

// sensitiveKey matches parameter names whose values are credentials, once
// '-' and '_' are removed: a name containing any of these (db_password,
// X-Api-Key, github_token) is sensitive.
var sensitiveKey = regexp.MustCompile(`(?i)(pass(word|wd)?|pwd|secret|token|apikey|authorization|credential|privatekey|cookie|sessionkey)`)

var keySeparators = strings.NewReplacer("-", "", "_", "")

func sensitive(key string) bool {
	return detect.NamedCredential(key) || sensitiveKey.MatchString(keySeparators.Replace(key))
}

// Redact returns params fit for the audit trail and logs: the values of
// credential-like keys replaced at any depth, then every secret and piece of
// personal data the detectors find, in values, member names and numbers,
// replaced by its rule's marker (a redacted number becomes a string). Parameters
// that are not JSON are replaced whole.
func Redact(params json.RawMessage) json.RawMessage {
	if len(params) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		b, _ := json.Marshal(Redacted)
		return b
	}
	out, err := json.Marshal(redactValue(v))
	if err == nil {
		// Strict: in the audit trail even a published sample key or a
		// test card number is redacted; nothing is lost by it.
		out, _, err = detect.DefaultStrict().RedactJSON(out, detect.Secrets, detect.PII)
	}
	if err != nil {
		b, _ := json.Marshal(Redacted)
		return b
	}
	return out
}

func redactValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			if sensitive(k) {
				t[k] = Redacted
				continue
			}
			t[k] = redactValue(x)
		}
	case []any:
		for i, x := range t {
			t[i] = redactValue(x)
		}
	}
	return v
}
