package redact

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
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

// Error returns te with the secrets and personal data in its text (its
// message, its field errors' messages, the strings of its details)
// replaced by their rules' markers, as Redact does for parameters: an
// error's text reaches the caller and the audit trail, and may echo what
// it failed on (a file named after a key, a parameter named by one, a
// provider's error quoting an Authorization header). te is left as it is
// when nothing is found; otherwise a copy is returned.
func Error(te *api.Error) *api.Error {
	if te == nil {
		return nil
	}
	fields := make([]string, len(te.Fields))
	for i, f := range te.Fields {
		fields[i] = f.Message
	}
	doc, err := json.Marshal(errorText{te.Message, fields, te.Details})
	if err != nil {
		return te
	}
	out, found, err := detect.DefaultStrict().RedactJSON(doc, detect.Secrets, detect.PII)
	if err != nil || len(found) == 0 {
		return te
	}
	var clean errorText
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if dec.Decode(&clean) != nil {
		return te
	}
	c := *te
	c.Message = clean.Message
	c.Fields = slices.Clone(te.Fields)
	for i := range c.Fields {
		if i < len(clean.Fields) {
			c.Fields[i].Message = clean.Fields[i]
		}
	}
	if te.Details != nil {
		c.Details = clean.Details
	}
	return &c
}

// errorText is what of an error is redacted.
type errorText struct {
	Message string         `json:"message"`
	Fields  []string       `json:"fields"`
	Details map[string]any `json:"details"`
}
