package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
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
	c, err := client.NewAgent(nc)
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

// agent connects as the example toolgate's development agent, with its
// capability token alone.
func (tg running) agent() (*client.Agent, func()) {
	nc, err := nats.Connect(tg.url, nats.Token(tg.token), nats.CustomInboxPrefix(tg.inbox))
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.NewAgent(nc)
	if err != nil {
		log.Fatal(err)
	}
	return c, nc.Close
}

// An agent follows its tenant's audit trail live while it calls a tool.
func ExampleAgent_TailLive() {
	tg := startToolgate()
	defer tg.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, closeConn := tg.agent()
	defer closeConn()

	events := make(chan string, 16)
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	started := make(chan error, 1)
	go func() {
		started <- c.TailLive(tailCtx, "demo", func(subject string, _ []byte) error {
			events <- subject
			return nil
		})
	}()
	// The subscription starts in the background: a call made before it is
	// not seen, so the agent calls again until one is.
	for {
		id, err := c.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"watched"}`),
			AgentContext:    api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"},
			CapabilityToken: tg.token}, client.InvokeOptions{})
		if err != nil {
			log.Fatal(err)
		}
		if _, err := c.Wait(ctx, "demo", id); err != nil {
			log.Fatal(err)
		}
		seen := time.After(2 * time.Second)
	events:
		for {
			select {
			case subject := <-events:
				if subject == "audit.demo.tool.succeeded" {
					fmt.Println(subject)
					return
				}
			case err := <-started:
				log.Fatal(err)
			case <-seen:
				break events
			}
		}
	}
	// Output:
	// audit.demo.tool.succeeded
}
