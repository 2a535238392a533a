package modeltool

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/toolgate/toolgate/internal/modelrouter"
)

// checkpointState is the state a model tool checkpoints.
type checkpointState struct {
	Split *splitState `json:"split,omitempty"`
}

// splitState is a split request's progress: the answers to its first parts.
// Digest names the parts they answer, so that a resumed run whose parts
// differ (other parameters, documents or windows) starts again instead of
// joining answers to other questions.
type splitState struct {
	Parts   int          `json:"parts"`
	Digest  string       `json:"digest"`
	Answers []partAnswer `json:"answers"`
}

// partAnswer is one part's answer, and what it cost.
type partAnswer struct {
	Model        string  `json:"model"`
	Content      string  `json:"content"`
	FinishReason string  `json:"finish_reason,omitempty"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	Cost         float64 `json:"cost"`
}

// partsDigest is a hash of the system prompt and the parts, as sent.
func partsDigest(system string, parts [][]modelrouter.Message) string {
	b, _ := json.Marshal(struct {
		System string                  `json:"system"`
		Parts  [][]modelrouter.Message `json:"parts"`
	}{system, parts})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// resumedAnswers returns the answers a resumed state holds for the parts
// want describes, or none when it is not such a state.
func resumedAnswers(resumed json.RawMessage, want splitState) []partAnswer {
	if len(resumed) == 0 {
		return nil
	}
	var st checkpointState
	if err := json.Unmarshal(resumed, &st); err != nil || st.Split == nil {
		return nil
	}
	s := st.Split
	if s.Parts != want.Parts || s.Digest != want.Digest || len(s.Answers) >= want.Parts {
		return nil
	}
	return s.Answers
}
