package modelrouter

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate/api"
)

// AnthropicVersion is the anthropic-version header sent with every
// Messages request.
const AnthropicVersion = "2023-06-01"

// Call is one request to one endpoint.
type Call struct {
	Model    *Model
	Endpoint string
	System   string
	Messages []Message
	// MaxTokens bounds the answer.
	MaxTokens   int
	Temperature *float64
	Stream      bool
	// Header holds the credentials; it is added to the request as is.
	Header http.Header
	// MaxBytes bounds the answer's body (a stream's total); default 1 MiB.
	MaxBytes int64
	// OnDelta receives each streamed piece of text.
	OnDelta func(text string)
}

// Answer is a provider's answer. On error it holds what arrived before the
// failure, so what was used can still be charged.
type Answer struct {
	Content      string
	FinishReason string
	InputTokens  int64
	OutputTokens int64
	// Counted is set when the token counts are toolgate's own, the
	// provider having sent none.
	Counted bool
}

// URL is the request URL of an endpoint for the model's API.
func (m *Model) URL(endpoint string) string {
	base := strings.TrimSuffix(endpoint, "/")
	if m.API == Anthropic {
		return base + "/messages"
	}
	return base + "/chat/completions"
}

// Do sends c and reads the answer.
func Do(ctx context.Context, client *http.Client, c Call) (Answer, error) {
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 20
	}
	body, err := c.body()
	if err != nil {
		return Answer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Model.URL(c.Endpoint), bytes.NewReader(body))
	if err != nil {
		return Answer{}, misconfigured(c.Model, "endpoint %q: %v", c.Endpoint, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "toolgate")
	if c.Model.API == Anthropic {
		req.Header.Set("anthropic-version", AnthropicVersion)
	}
	if c.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	for k, vs := range c.Header {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	if err != nil {
		return Answer{}, err // the caller classifies and scrubs
	}
	defer resp.Body.Close()
	if err := c.status(resp); err != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		return Answer{}, err
	}
	if resp.ContentLength > c.MaxBytes {
		return Answer{}, c.tooLarge()
	}
	rd := &limited{r: resp.Body, n: c.MaxBytes}
	var a Answer
	switch {
	case c.Stream && c.Model.API == Anthropic:
		a, err = c.anthropicStream(rd)
	case c.Stream:
		a, err = c.openaiStream(rd)
	default:
		var data []byte
		data, err = io.ReadAll(rd)
		if err == nil && c.Model.API == Anthropic {
			a, err = c.anthropicAnswer(data)
		} else if err == nil {
			a, err = c.openaiAnswer(data)
		}
	}
	if err != nil && a.InputTokens == 0 {
		// The provider took the request: its input is charged, counted here.
		c.count(&a)
	}
	if errors.Is(err, errTooLarge) {
		err = c.tooLarge()
	} else if err != nil && ctx.Err() == nil && !isAPIError(err) {
		err = api.NewError(api.ExternalAPIError, api.EModelStreamCut, "model %s: the answer broke off: %v", c.Model.Name, err).AsRetryable()
	}
	if err != nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return a, err
}

func isAPIError(err error) bool {
	var te *api.Error
	return errors.As(err, &te)
}

var errTooLarge = errors.New("answer too large")

// limited is io.LimitReader that says when the limit is passed.
type limited struct {
	r io.Reader
	n int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errTooLarge
	}
	return n, err
}

func (c *Call) tooLarge() error {
	return api.NewError(api.ResourceExhausted, api.EModelAnswerTooLarge, "model %s: the answer exceeds %d bytes", c.Model.Name, c.MaxBytes).
		WithDetail("max_bytes", c.MaxBytes)
}

func misconfigured(m *Model, format string, args ...any) *api.Error {
	return api.NewError(api.ToolExecutionError, api.EModelMisconfigured, "model %s: %s", m.Name, fmt.Sprintf(format, args...)).
		WithDetail("not_started", true)
}

func (c *Call) malformed(format string, args ...any) *api.Error {
	return api.NewError(api.ExternalAPIError, api.EModelMalformed, "model %s: the answer is not %s wire format: %s",
		c.Model.Name, c.Model.API, fmt.Sprintf(format, args...))
}

func (c *Call) body() ([]byte, error) {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	system := c.System
	var msgs []msg
	for _, m := range c.Messages {
		if m.Role == "system" && c.Model.API == Anthropic {
			system = strings.TrimSpace(system + "\n" + m.Content)
			continue
		}
		msgs = append(msgs, msg(m))
	}
	if c.Model.API == Anthropic {
		return json.Marshal(struct {
			Model       string   `json:"model"`
			MaxTokens   int      `json:"max_tokens"`
			System      string   `json:"system,omitempty"`
			Messages    []msg    `json:"messages"`
			Temperature *float64 `json:"temperature,omitempty"`
			Stream      bool     `json:"stream,omitempty"`
		}{c.Model.UpstreamModel, c.MaxTokens, system, msgs, c.Temperature, c.Stream})
	}
	if system != "" {
		msgs = append([]msg{{Role: "system", Content: system}}, msgs...)
	}
	type streamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	var so *streamOptions
	if c.Stream {
		so = &streamOptions{IncludeUsage: true}
	}
	return json.Marshal(struct {
		Model         string         `json:"model"`
		Messages      []msg          `json:"messages"`
		MaxTokens     int            `json:"max_tokens"`
		Temperature   *float64       `json:"temperature,omitempty"`
		Stream        bool           `json:"stream,omitempty"`
		StreamOptions *streamOptions `json:"stream_options,omitempty"`
	}{c.Model.UpstreamModel, msgs, c.MaxTokens, c.Temperature, c.Stream, so})
}

// status turns an error status into its error, with the provider's own
// message when its error body says one.
func (c *Call) status(resp *http.Response) error {
	code := resp.StatusCode
	if code < 400 {
		return nil
	}
	var eb struct {
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	_ = json.Unmarshal(data, &eb)
	what := fmt.Sprintf("model %s: the provider answered %d", c.Model.Name, code)
	if eb.Error.Message != "" {
		what += fmt.Sprintf(" (%s: %.200s)", eb.Error.Type, eb.Error.Message)
	}
	var e *api.Error
	switch {
	case code == http.StatusTooManyRequests:
		e = api.NewError(api.RateLimitExceeded, api.ERateLimited, "%s", what).AsRetryable().WithDetail("not_started", true)
	case code >= 500 || code == 529 || code == http.StatusRequestTimeout: // 529: Anthropic's overloaded
		e = api.NewError(api.ExternalAPIError, api.EExternalStatus, "%s", what).AsRetryable()
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		e = api.NewError(api.ExternalAPIError, api.EExternalAuth, "%s", what)
	default:
		e = api.NewError(api.ExternalAPIError, api.EExternalStatus, "%s", what)
	}
	e.WithDetail("status", code)
	if ms, ok := retryAfter(resp.Header.Get("Retry-After")); ok && e.Retryable {
		e.WithDetail("retry_after_ms", ms)
	}
	return e
}

func retryAfter(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
		return min(n, 86400) * 1000, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(time.Until(t), 0), 24*time.Hour).Milliseconds(), true
	}
	return 0, false
}

func (c *Call) openaiAnswer(data []byte) (Answer, error) {
	var r struct {
		Object  string `json:"object"`
		Choices []struct {
			Message *struct {
				Content *string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return Answer{}, c.malformed("%v", err)
	}
	if len(r.Choices) == 0 || r.Choices[0].Message == nil || r.Choices[0].Message.Content == nil {
		return Answer{}, c.malformed("no choices[0].message.content")
	}
	a := Answer{Content: *r.Choices[0].Message.Content, FinishReason: r.Choices[0].FinishReason}
	if r.Usage != nil {
		a.InputTokens, a.OutputTokens = r.Usage.PromptTokens, r.Usage.CompletionTokens
	} else {
		c.count(&a)
	}
	return a, nil
}

func (c *Call) anthropicAnswer(data []byte) (Answer, error) {
	var r struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		StopReason string `json:"stop_reason"`
		Usage      *struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return Answer{}, c.malformed("%v", err)
	}
	if r.Type != "message" || r.Content == nil {
		return Answer{}, c.malformed("type %q is not message, or content is missing", r.Type)
	}
	var b strings.Builder
	for _, blk := range r.Content {
		if blk.Type == "text" {
			b.WriteString(blk.Text)
		}
	}
	a := Answer{Content: b.String(), FinishReason: r.StopReason}
	if r.Usage != nil {
		a.InputTokens, a.OutputTokens = r.Usage.InputTokens, r.Usage.OutputTokens
	} else {
		c.count(&a)
	}
	return a, nil
}

// count fills the token counts with toolgate's own.
func (c *Call) count(a *Answer) {
	if a.InputTokens == 0 {
		a.InputTokens = int64(CountMessages(c.System, c.Messages))
	}
	a.OutputTokens = int64(CountText(a.Content))
	a.Counted = true
}

// sse reads server-sent events: it calls fn with each event's name and
// data until fn returns done or the stream ends.
func sse(r io.Reader, fn func(event string, data []byte) (done bool, err error)) (finished bool, err error) {
	br := bufio.NewReaderSize(r, 16<<10)
	var event string
	var data []byte
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return false, errors.New("an event line exceeds 16 KiB")
		}
		if err != nil && (len(line) == 0 || err != io.EOF) {
			if err == io.EOF {
				return false, nil
			}
			return false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if data != nil {
				done, ferr := fn(event, data)
				if ferr != nil || done {
					return done, ferr
				}
			}
			event, data = "", nil
		case line[0] == ':':
		case bytes.HasPrefix(line, []byte("event:")):
			event = string(bytes.TrimSpace(line[6:]))
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(line[5:], []byte(" "))
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, d...)
		}
		if err == io.EOF {
			return false, nil
		}
	}
}

func (c *Call) openaiStream(r io.Reader) (Answer, error) {
	var a Answer
	var b strings.Builder
	var usage bool
	finished, err := sse(r, func(_ string, data []byte) (bool, error) {
		if string(data) == "[DONE]" {
			return true, nil
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			return false, c.malformed("a stream chunk: %v", err)
		}
		if ch.Error != nil {
			return false, api.NewError(api.ExternalAPIError, api.EExternalStatus, "model %s: the stream reported an error: %.200s",
				c.Model.Name, ch.Error.Message).AsRetryable()
		}
		for _, choice := range ch.Choices {
			if choice.Delta.Content != "" {
				b.WriteString(choice.Delta.Content)
				if c.OnDelta != nil {
					c.OnDelta(choice.Delta.Content)
				}
			}
			if choice.FinishReason != nil {
				a.FinishReason = *choice.FinishReason
			}
		}
		if ch.Usage != nil {
			usage = true
			a.InputTokens, a.OutputTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
		}
		return false, nil
	})
	a.Content = b.String()
	if !usage {
		c.count(&a)
	}
	if err == nil && !finished {
		err = api.NewError(api.ExternalAPIError, api.EModelStreamCut, "model %s: the stream ended before [DONE]", c.Model.Name).AsRetryable()
	}
	return a, err
}

func (c *Call) anthropicStream(r io.Reader) (Answer, error) {
	var a Answer
	var b strings.Builder
	var started, outCounted bool
	finished, err := sse(r, func(event string, data []byte) (bool, error) {
		var ev struct {
			Type    string `json:"type"`
			Message *struct {
				Usage struct {
					InputTokens  int64 `json:"input_tokens"`
					OutputTokens int64 `json:"output_tokens"`
				} `json:"usage"`
			} `json:"message"`
			Delta *struct {
				Type       string `json:"type"`
				Text       string `json:"text"`
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			Usage *struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
			Error *struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return false, c.malformed("a stream event: %v", err)
		}
		if event != "" && ev.Type != event {
			return false, c.malformed("event %q carries data of type %q", event, ev.Type)
		}
		switch ev.Type {
		case "message_start":
			if ev.Message == nil {
				return false, c.malformed("message_start without message")
			}
			started = true
			a.InputTokens, a.OutputTokens = ev.Message.Usage.InputTokens, ev.Message.Usage.OutputTokens
		case "content_block_delta":
			if !started || ev.Delta == nil {
				return false, c.malformed("content_block_delta before message_start or without delta")
			}
			if ev.Delta.Type == "text_delta" {
				b.WriteString(ev.Delta.Text)
				if c.OnDelta != nil {
					c.OnDelta(ev.Delta.Text)
				}
			}
		case "message_delta":
			if ev.Delta != nil {
				a.FinishReason = ev.Delta.StopReason
			}
			if ev.Usage != nil {
				a.OutputTokens, outCounted = ev.Usage.OutputTokens, true
			}
		case "message_stop":
			return true, nil
		case "error":
			msg := ""
			if ev.Error != nil {
				msg = ev.Error.Type + ": " + ev.Error.Message
			}
			return false, api.NewError(api.ExternalAPIError, api.EExternalStatus, "model %s: the stream reported an error: %.200s",
				c.Model.Name, msg).AsRetryable()
		case "content_block_start", "content_block_stop", "ping":
		default:
			// Unknown event types are to be ignored, the API's versioning
			// policy says.
		}
		return false, nil
	})
	a.Content = b.String()
	if !outCounted {
		in := a.InputTokens
		c.count(&a)
		if in > 0 {
			a.InputTokens = in
		}
	}
	if err == nil && !finished {
		err = api.NewError(api.ExternalAPIError, api.EModelStreamCut, "model %s: the stream ended before message_stop", c.Model.Name).AsRetryable()
	}
	return a, err
}
