package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
)

// running is a toolgate of the example's own: `toolgate serve --examples`
// in this process, on an embedded server with authentication, as a
// newcomer's `make run` starts it.
type running struct {
	url, dir, token, inbox string
	stop                   func()
}

func startToolgate() running {
	dir, err := os.MkdirTemp("", "toolgate-example")
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	type up struct {
		url string
		n   *node.Node
	}
	ready := make(chan up, 1)
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, node.Config{Examples: true,
			Embedded: node.EmbeddedOptions{Listen: "127.0.0.1:-1", DataDir: dir},
			Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:    func(url string, n *node.Node) { ready <- up{url, n} }})
	}()
	var u up
	select {
	case u = <-ready:
	case err := <-done:
		log.Fatal(err)
	}
	return running{url: u.url, dir: dir, token: u.n.DevToken, inbox: u.n.DevInboxPrefix,
		stop: func() { cancel(); <-done; os.RemoveAll(dir) }}
}

// An agent holding only its capability token calls a tool and waits for
// the result.
func Example() {
	tg := startToolgate()
	defer tg.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The token is the agent's only credential, on the bus and in the call.
	nc, err := nats.Connect(tg.url, nats.Token(tg.token), nats.CustomInboxPrefix(tg.inbox))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	id, err := c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"hello"}`),
		AgentContext:    api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"},
		CapabilityToken: tg.token}, client.InvokeOptions{})
	if err != nil {
		log.Fatal(err)
	}
	resp, err := c.Wait(ctx, "demo", id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, string(resp.Result))

	rec, err := c.Status(ctx, "demo", id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Status)
	// Output:
	// success {"message":"hello"}
	// success
}

// An operator, connected with the operator credentials serve wrote, reads
// the last events of a tenant's audit trail.
func ExampleClient_TailLast() {
	tg := startToolgate()
	defer tg.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	agent, err := nats.Connect(tg.url, nats.Token(tg.token), nats.CustomInboxPrefix(tg.inbox))
	if err != nil {
		log.Fatal(err)
	}
	defer agent.Close()
	ac, _ := client.New(agent)
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"audited"}`),
		AgentContext:    api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"},
		CapabilityToken: tg.token}, client.InvokeOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ac.Wait(ctx, "demo", id); err != nil {
		log.Fatal(err)
	}

	creds := node.CredsPath(tg.dir, busauth.RoleOperator)
	op, err := nats.Connect(tg.url, busauth.CredentialsOption(creds))
	if err != nil {
		log.Fatal(err)
	}
	defer op.Close()
	oc, _ := client.New(op)
	// The terminal event comes last; the one before it says the call started.
	err = oc.TailLast(ctx, "demo", 2, func(subject string, _ []byte) error {
		fmt.Println(strings.TrimPrefix(subject, "audit.demo."))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// tool.invoked
	// tool.succeeded
}
