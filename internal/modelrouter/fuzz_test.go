package modelrouter

import (
	"bytes"
	"testing"
)

// FuzzStreams feeds arbitrary bytes to both stream decoders and both answer
// decoders: they must return, never panic, and never report more text
// than they were given.
func FuzzStreams(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":"a"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, api := range []string{OpenAI, Anthropic} {
			c := &Call{Model: &Model{Name: "m", API: api}, MaxBytes: 1 << 20}
			var a Answer
			if api == OpenAI {
				a, _ = c.openaiStream(bytes.NewReader(data))
				b, _ := c.openaiAnswer(data)
				a.Content += b.Content
			} else {
				a, _ = c.anthropicStream(bytes.NewReader(data))
				b, _ := c.anthropicAnswer(data)
				a.Content += b.Content
			}
			if len(a.Content) > 2*len(data) {
				t.Fatalf("%s: %d bytes of text from %d bytes", api, len(a.Content), len(data))
			}
		}
	})
}
