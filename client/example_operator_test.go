package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/client"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
)

// operator connects with the operator credentials serve wrote, and signs
// its administrative requests with them.
func (tg running) operator() (*client.Operator, func()) {
	creds := node.CredsPath(tg.dir, busauth.RoleOperator)
	nc, err := nats.Connect(tg.url, busauth.CredentialsOption(creds))
	if err != nil {
		log.Fatal(err)
	}
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	signer, err := busauth.SignerFromCreds(creds)
	if err != nil {
		log.Fatal(err)
	}
	c.Sign = func(subject string, body []byte) (nats.Header, error) {
		return signer.Sign(nil, subject, body, time.Now())
	}
	return c, nc.Close
}

// An operator reads the last events of a tenant's audit trail.
func ExampleOperator_TailLast() {
	tg := startToolgate()
	defer tg.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ac, closeAgent := tg.agent()
	defer closeAgent()
	id, err := ac.Invoke(ctx, api.Request{ToolID: "echo", Parameters: json.RawMessage(`{"message":"audited"}`),
		AgentContext:    api.AgentContext{AgentDID: "did:agent:demo", TenantID: "demo"},
		CapabilityToken: tg.token}, client.InvokeOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ac.Wait(ctx, "demo", id); err != nil {
		log.Fatal(err)
	}

	oc, closeOperator := tg.operator()
	defer closeOperator()
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

// An operator forces a tool's breaker open, signed with its credentials,
// lists the breakers, and releases it; the change records who made it.
func ExampleOperator_SetBreaker() {
	tg := startToolgate()
	defer tg.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	oc, closeOperator := tg.operator()
	defer closeOperator()

	st, err := oc.SetBreaker(ctx, "echo", api.BreakerOpen, "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Key, st.State, st.Forced, strings.HasPrefix(st.By, "operator:"))
	all, err := oc.Breakers(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range all {
		fmt.Println(b.Key, b.State)
	}
	if _, err := oc.SetBreaker(ctx, "echo", api.BreakerRelease, ""); err != nil {
		log.Fatal(err)
	}
	// Output:
	// echo open true true
	// echo open
}
