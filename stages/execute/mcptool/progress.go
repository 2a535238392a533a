package mcptool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/stages/execute/kind"
)

// ResumeMeta is the _meta key of a tools/call under which a run resumed
// from a checkpoint hands the tool its state.
const ResumeMeta = "toolgate/resume"

// An MCP tool reports progress and saves checkpoints through progress
// notifications (docs/checkpoints.md): progress and total give the
// percentage, and a message that is a control line, such as
//
//	toolgate:checkpoint {"next":5}
//	toolgate:checkpoint.named before-upload {"next":5}
//
// saves a checkpoint. Notifications reach the client, not the call, so
// each call is found by its progress token.
var calls sync.Map // progress token → *progressCall

// progressCall is the Progress of one tools/call.
type progressCall struct {
	ctx      context.Context
	progress kind.Progress
	mu       sync.Mutex
	err      error     // the first checkpoint that could not be saved
	last     time.Time // when the last notification was handled
}

// settle is how long the notifications of a call that sent some are
// awaited after its result: the client hands notifications to their
// handler in order but apart from responses, so the last ones sent before
// the result may still be on their way.
const (
	settle    = 25 * time.Millisecond
	settleMax = time.Second
)

// track gives params a progress token routed to ctx's Progress, and the
// resumed state, if any; done ends the routing and returns the first
// checkpoint failure.
func track(ctx context.Context, params *mcp.CallToolParams) (done func() error) {
	p := kind.ProgressFrom(ctx)
	var b [12]byte
	_, _ = rand.Read(b[:])
	token := "toolgate-" + hex.EncodeToString(b[:])
	params.SetProgressToken(token)
	if state := p.Resumed(); state != nil {
		params.Meta[ResumeMeta] = json.RawMessage(state)
	}
	pc := &progressCall{ctx: ctx, progress: p}
	calls.Store(token, pc)
	return func() error {
		end := time.Now().Add(settleMax)
		for {
			pc.mu.Lock()
			last := pc.last
			pc.mu.Unlock()
			if last.IsZero() || time.Since(last) >= settle || time.Now().After(end) {
				break
			}
			time.Sleep(settle - time.Since(last))
		}
		calls.Delete(token)
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return pc.err
	}
}

// onProgress is the client's progress notification handler.
func onProgress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	if req == nil || req.Params == nil {
		return
	}
	token, _ := req.Params.ProgressToken.(string)
	v, ok := calls.Load(token)
	if !ok {
		return
	}
	v.(*progressCall).notify(req.Params)
}

func (pc *progressCall) notify(n *mcp.ProgressNotificationParams) {
	defer func() {
		pc.mu.Lock()
		pc.last = time.Now()
		pc.mu.Unlock()
	}()
	if line, ok := strings.CutPrefix(n.Message, "toolgate:"); ok {
		verb, arg, _ := strings.Cut(line, " ")
		if verb == "checkpoint" || strings.HasPrefix(verb, "checkpoint.") {
			pc.checkpoint(verb, []byte(strings.TrimSpace(arg)))
			return
		}
	}
	if n.Total > 0 && n.Progress >= 0 && n.Progress <= n.Total {
		pc.progress.Report(100*n.Progress/n.Total, n.Message)
	}
}

func (pc *progressCall) checkpoint(verb string, arg []byte) {
	cpKind, name, state, err := kind.ParseCheckpoint(verb, arg)
	if err == nil {
		if cpKind == api.CheckpointMicro {
			err = pc.progress.Checkpoint(state)
		} else {
			_, err = kind.SaveCheckpoint(pc.ctx, cpKind, name, state)
		}
	}
	if err != nil {
		var e *api.Error
		if !errors.As(err, &e) {
			e = api.WrapError(err, api.CheckpointFailed, api.ECheckpointCreate, "an MCP tool's checkpoint: %v", err)
		}
		pc.mu.Lock()
		if pc.err == nil {
			pc.err = e
		}
		pc.mu.Unlock()
	}
}
