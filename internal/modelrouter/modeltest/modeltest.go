// Package modeltest serves the OpenAI chat completions and Anthropic
// Messages wire formats on loopback for tests: answers streamed or not,
// error bodies, 429 with Retry-After, 5xx, hangs, answers that are not the
// wire format, oversized answers and streams that stop mid-way.
package modeltest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Behaviours.
const (
	OK        = "ok"
	Fail500   = "500"
	Limited   = "429"
	Hang      = "hang"
	Garbage   = "garbage" // 200 with a body that is not the wire format
	Huge      = "huge"    // an answer of 2 MiB
	Cut       = "cut"     // a stream that stops after two deltas
	BadAuth   = "401"
	Invalid   = "400" // the provider refuses the request itself
	Timeout   = "408"
	WrongPath = "wrong"
)

// Server is one provider endpoint.
type Server struct {
	*httptest.Server
	// API is openai or anthropic.
	API string
	// Key, when set, is the credential every request must carry.
	Key string
	// Answer is the text answered, streamed word by word.
	Answer string
	// InputTokens and OutputTokens are the usage reported.
	InputTokens, OutputTokens int64

	mu        sync.Mutex
	behaviour string
	hangOn    int64
	failFirst int64
	calls     atomic.Int64
	last      map[string]any
	requests  []map[string]any
	release   chan struct{}
	released  sync.Once
}

// New starts a server of the given API on 127.0.0.1, closed when t ends.
func New(t testing.TB, api string) *Server {
	s := &Server{API: api, Answer: "Hello from " + api, InputTokens: 12, OutputTokens: 4, behaviour: OK,
		release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.Release()
		s.Close()
	})
	return s
}

// Base is the endpoint to put in a catalogue entry.
func (s *Server) Base() string { return s.URL + "/v1" }

// Set changes how the server answers.
func (s *Server) Set(b string) {
	s.mu.Lock()
	s.behaviour = b
	s.mu.Unlock()
}

// SetUsage changes the usage the server reports (its answers stay within
// a request's max_tokens).
func (s *Server) SetUsage(in, out int64) {
	s.mu.Lock()
	s.InputTokens, s.OutputTokens = in, out
	s.mu.Unlock()
}

// HangOn makes the n-th request the server receives (counting from 1) hang
// as Hang does, whatever the behaviour; 0 hangs none.
func (s *Server) HangOn(n int64) {
	s.mu.Lock()
	s.hangOn = n
	s.mu.Unlock()
}

// FailFirst makes the first n requests the server receives answer as
// Fail500 does, whatever the behaviour.
func (s *Server) FailFirst(n int64) {
	s.mu.Lock()
	s.failFirst = n
	s.mu.Unlock()
}

// Release lets every hanging request return, now and from then on: a
// request left hanging by a client that is gone without closing it (a
// worker stopped in the test's process) would hold the server's Close.
func (s *Server) Release() { s.released.Do(func() { close(s.release) }) }

// Requests is every request body the server decoded, in order.
func (s *Server) Requests() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]map[string]any(nil), s.requests...)
}

// Calls is how many requests the server has received.
func (s *Server) Calls() int64 { return s.calls.Load() }

// Last is the last request body.
func (s *Server) Last() map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *Server) fail(w http.ResponseWriter, status int, typ, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if s.API == "anthropic" {
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%q}}`, typ, msg)
		return
	}
	fmt.Fprintf(w, `{"error":{"message":%q,"type":%q,"param":null,"code":null}}`, msg, typ)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	n := s.calls.Add(1)
	s.mu.Lock()
	b := s.behaviour
	if n == s.hangOn {
		b = Hang
	} else if n <= s.failFirst {
		b = Fail500
	}
	inTokens, outTokens := s.InputTokens, s.OutputTokens
	s.mu.Unlock()
	path := "/v1/chat/completions"
	if s.API == "anthropic" {
		path = "/v1/messages"
	}
	if r.Method != http.MethodPost || r.URL.Path != path {
		s.fail(w, http.StatusNotFound, "not_found_error", "no route "+r.URL.Path)
		return
	}
	var req map[string]any
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.fail(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	s.mu.Lock()
	s.last = req
	s.requests = append(s.requests, req)
	s.mu.Unlock()
	if s.Key != "" {
		got := r.Header.Get("Authorization")
		want := "Bearer " + s.Key
		if s.API == "anthropic" {
			got, want = r.Header.Get("x-api-key"), s.Key
			if r.Header.Get("anthropic-version") == "" {
				s.fail(w, http.StatusBadRequest, "invalid_request_error", "anthropic-version header is required")
				return
			}
		}
		if got != want {
			s.fail(w, http.StatusUnauthorized, "authentication_error", "invalid x-api-key")
			return
		}
	}
	if msgs, _ := req["messages"].([]any); len(msgs) == 0 || req["model"] == nil || req["max_tokens"] == nil {
		s.fail(w, http.StatusBadRequest, "invalid_request_error", "model, messages and max_tokens are required")
		return
	}
	stream, _ := req["stream"].(bool)
	// A provider answers within max_tokens.
	if mt, ok := req["max_tokens"].(float64); ok && int64(mt) < outTokens {
		outTokens = int64(mt)
	}
	switch b {
	case Fail500:
		s.fail(w, http.StatusInternalServerError, "api_error", "internal server error")
		return
	case Limited:
		w.Header().Set("Retry-After", "1")
		s.fail(w, http.StatusTooManyRequests, "rate_limit_error", "rate limited")
		return
	case BadAuth:
		s.fail(w, http.StatusUnauthorized, "authentication_error", "invalid key")
		return
	case Invalid:
		s.fail(w, http.StatusBadRequest, "invalid_request_error", "max_tokens: must be at most 4096")
		return
	case Timeout:
		s.fail(w, http.StatusRequestTimeout, "timeout_error", "request timed out")
		return
	case Hang:
		select {
		case <-r.Context().Done():
		case <-s.release:
		case <-time.After(time.Minute):
		}
		return
	case Garbage:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"ok","data":[1,2,3]}`)
		return
	case Huge:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"text":"%s"}`, strings.Repeat("x", 2<<20))
		return
	}
	words := strings.SplitAfter(s.Answer, " ")
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		if s.API == "anthropic" {
			fmt.Fprintf(w, `{"id":"msg_01","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":%q}],`+
				`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":%d}}`,
				req["model"], s.Answer, inTokens, outTokens)
			return
		}
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":%q,`+
			`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],`+
			`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			req["model"], s.Answer, inTokens, outTokens, inTokens+outTokens)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	send := func(event, data string) {
		if event != "" {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		if fl != nil {
			fl.Flush()
		}
	}
	if s.API == "anthropic" {
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant",`+
			`"content":[],"model":%q,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":1}}}`,
			req["model"], inTokens))
		send("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		send("ping", `{"type": "ping"}`)
		for i, wd := range words {
			if b == Cut && i == 2 {
				return
			}
			d, _ := json.Marshal(wd)
			send("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%s}}`, d))
		}
		send("content_block_stop", `{"type":"content_block_stop","index":0}`)
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, outTokens))
		send("message_stop", `{"type":"message_stop"}`)
		return
	}
	for i, wd := range words {
		if b == Cut && i == 2 {
			return
		}
		d, _ := json.Marshal(wd)
		role := ""
		if i == 0 {
			role = `"role":"assistant",`
		}
		send("", fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":%q,`+
			`"choices":[{"index":0,"delta":{%s"content":%s},"finish_reason":null}],"usage":null}`, req["model"], role, d))
	}
	send("", fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":%q,`+
		`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}`, req["model"]))
	send("", fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":%q,`+
		`"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
		req["model"], inTokens, outTokens, inTokens+outTokens))
	send("", "[DONE]")
}
