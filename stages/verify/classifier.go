package verify

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/toolgate/toolgate/internal/detect"
	"github.com/toolgate/toolgate/internal/envelope"
)

// RuleClassifier names the findings of a Classifier.
const RuleClassifier = "prompt.classifier"

// maxClassified bounds the text sent to a classifier for one result.
const maxClassified = 64 << 10

// Classifier judges whether a result's text holds instructions aimed at the
// agent, beside the rules: a model or service an operator plugs in. It is
// asked only about results the prompt_injection rules pass, and its
// finding takes that detector's action. An error lets the result through
// with a warning: the rules still stand, and an unavailable classifier must
// not stop every call.
type Classifier interface {
	// Classify returns a non-empty label when text holds instructions
	// aimed at the agent.
	Classify(ctx context.Context, text string) (label string, err error)
}

// classify asks the configured classifier about the strings of result.
func (v *Verifier) classify(ctx context.Context, inv *envelope.Invocation, result []byte) []detect.Finding {
	if v.cfg.Classifier == nil {
		return nil
	}
	var x any
	if json.Unmarshal(result, &x) != nil {
		return nil
	}
	var b strings.Builder
	texts(x, &b)
	if b.Len() == 0 {
		return nil
	}
	label, err := v.cfg.Classifier.Classify(ctx, b.String())
	if err != nil {
		inv.Metadata.Warnings = append(inv.Metadata.Warnings, "injection classifier unavailable: "+err.Error())
		return nil
	}
	if label == "" {
		return nil
	}
	return []detect.Finding{{Rule: RuleClassifier, Detector: detect.PromptInjection}}
}

// texts writes the strings of x, one a line, up to maxClassified bytes.
func texts(x any, b *strings.Builder) {
	switch t := x.(type) {
	case string:
		if room := maxClassified - b.Len(); room > 0 {
			b.WriteString(t[:min(len(t), room)])
			b.WriteByte('\n')
		}
	case map[string]any:
		for _, y := range t {
			texts(y, b)
		}
	case []any:
		for _, y := range t {
			texts(y, b)
		}
	}
}

// HTTPClassifier asks an HTTP endpoint: it POSTs {"text": …} and reads
// {"label": …} ("" or absent when the text is clean).
type HTTPClassifier struct {
	URL string
	// Client defaults to one with a 5 s timeout.
	Client *http.Client
}

var defaultClassifierClient = &http.Client{Timeout: 5 * time.Second}

// Classify implements Classifier.
func (h *HTTPClassifier) Classify(ctx context.Context, text string) (string, error) {
	body, _ := json.Marshal(map[string]string{"text": text})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	c := h.Client
	if c == nil {
		c = defaultClassifierClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("classifier answered %s", resp.Status)
	}
	var out struct {
		Label string `json:"label"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&out); err != nil {
		return "", fmt.Errorf("classifier answer: %w", err)
	}
	return out.Label, nil
}
