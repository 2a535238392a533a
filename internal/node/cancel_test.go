package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// TestCancelUnknownInvocation: cancelling an id toolgate has never seen is
// refused with invocation_not_found and writes nothing, so a later
// invocation that happens to use the id runs normally.
func TestCancelUnknownInvocation(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const tenant, id = "unk", "not-yet-used"

	_, err := e.client.Cancel(ctx, tenant, id, "")
	var te *api.Error
	if !errors.Is(err, api.ErrInvocationNotFound) || !errors.As(err, &te) || te.ECode != api.EInvocationNotFound {
		t.Fatalf("cancel of an unknown id: %v, want %s", err, api.EInvocationNotFound)
	}
	_, err = e.client.Status(ctx, tenant, id)
	if !errors.Is(err, api.ErrInvocationNotFound) || !errors.As(err, &te) || te.ECode != api.EInvocationNotFound {
		t.Fatalf("status of an unknown id: %v, want %s", err, api.EInvocationNotFound)
	}
	if _, err := e.client.Invoke(ctx, request(tenant, "echo", `{"message":"hi"}`), clientOpts(id)); err != nil {
		t.Fatal(err)
	}
	if resp, err := e.client.Wait(ctx, tenant, id); err != nil || resp.Status != api.StatusSuccess {
		t.Fatalf("invocation after a refused cancel: %+v, %v", resp, err)
	}
}

// TestCancelBeforeValidate: a cancel that arrives after JetStream accepted
// the invocation but before any stage wrote its record is accepted, and the
// invocation ends cancelled without running.
func TestCancelBeforeValidate(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{Stages: allBut(subjects.Validate)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := e.client.Invoke(ctx, request("early", "test.block", `{}`), clientOpts(""))
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.client.Cancel(ctx, "early", id, "too soon")
	if err != nil || !rec.CancelRequested {
		t.Fatalf("cancel of an accepted invocation: %+v, %v", rec, err)
	}
	e.runStage(subjects.Validate, nil, 1, 0)
	resp, err := e.client.Wait(ctx, "early", id)
	if err != nil || resp.Status != api.StatusCancelled || e.blocks.Load() != 0 {
		t.Fatalf("early cancel: %+v, %v, tool ran %d times", resp, err, e.blocks.Load())
	}
}

// TestControlErrorHeaders: the micro error code header is a number (the
// services spec requires one), and the body still carries the ToolError
// with its ToolErrorCode and E-code.
func TestControlErrorHeaders(t *testing.T) {
	e := newEnv(t, topology.TopologyOptions{})
	e.startPipeline(node.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cases := []struct {
		subject, body, ecode string
	}{
		{subjects.SvcStatus, `{"tenant_id":"h","invocation_id":"nope"}`, api.EInvocationNotFound},
		{subjects.SvcStatus, `{}`, api.ERequestInvalid},
		{subjects.SvcToolsGet, `{"tool_id":"no.such.tool"}`, api.EToolNotFound},
	}
	for _, c := range cases {
		t.Run(c.ecode, func(t *testing.T) {
			msg, err := e.nc.RequestWithContext(ctx, c.subject, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			code := msg.Header.Get(micro.ErrorCodeHeader)
			if n, err := strconv.Atoi(code); err != nil || n != api.Number(c.ecode) || n == 0 {
				t.Fatalf("%s = %q, want the number of %s", micro.ErrorCodeHeader, code, c.ecode)
			}
			var te api.Error
			if err := json.Unmarshal(msg.Data, &te); err != nil || te.ECode != c.ecode || te.Code == "" {
				t.Fatalf("error body %s: %v", msg.Data, err)
			}
		})
	}
}
