package modelrouter

import (
	"sync"

	tiktoken "github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// Message is one chat message. Role is system, user or assistant.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Counting follows OpenAI's published recipe for chat messages: each
// message costs its content's tokens plus a fixed overhead, and every reply
// is primed with three more. Anthropic's tokenizer differs by a few
// percent; the count is an estimate for routing, and billing uses the
// provider's own counts.
const (
	perMessage = 4
	perReply   = 3
)

var (
	encOnce sync.Once
	enc     *tiktoken.Tiktoken
	encErr  error
)

// encoding loads cl100k_base from the BPE ranks compiled into the binary:
// no network.
func encoding() (*tiktoken.Tiktoken, error) {
	encOnce.Do(func() {
		tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
		enc, encErr = tiktoken.GetEncoding("cl100k_base")
	})
	return enc, encErr
}

// CountText counts the tokens of s. Should the tokenizer fail to load, it
// falls back to one token per four bytes, rounded up.
func CountText(s string) int {
	e, err := encoding()
	if err != nil {
		return (len(s) + 3) / 4
	}
	return len(e.Encode(s, nil, nil))
}

// CountMessages counts a request's tokens: the system prompt and every
// message with its overhead.
func CountMessages(system string, msgs []Message) int {
	n := perReply
	if system != "" {
		n += perMessage + CountText(system)
	}
	for _, m := range msgs {
		n += perMessage + CountText(m.Content)
	}
	return n
}

// Truncation strategies a request may allow when it fits no window.
const (
	// TruncateNone refuses a request that does not fit (the default).
	TruncateNone = "none"
	// TruncateOldest keeps the system prompt and the most recent messages
	// (the seed's hot context) and drops the oldest until the rest fits.
	TruncateOldest = "drop_oldest"
	// TruncateMiddle keeps the first message (the task) and the most
	// recent ones, dropping from the middle.
	TruncateMiddle = "drop_middle"
)

// Truncate drops messages by strategy until the request counts at most
// limit tokens; ok is false when even the last message alone is too big.
func Truncate(strategy, system string, msgs []Message, limit int) ([]Message, bool) {
	keepFirst := strategy == TruncateMiddle && len(msgs) > 1
	out := msgs
	for CountMessages(system, out) > limit {
		switch {
		case len(out) <= 1:
			return out, false
		case keepFirst && len(out) > 2:
			out = append([]Message{out[0]}, out[2:]...)
		case keepFirst:
			return out, false
		default:
			out = out[1:]
		}
	}
	return out, true
}
