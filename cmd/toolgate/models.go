package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/stages/execute/modeltool"
)

// modelsCmd manages the model catalogue: register FILE | list | delete NAME
// | stats --metrics URL.
func modelsCmd(ctx context.Context, args []string) error {
	const help = "models: register FILE | list | delete NAME | policy FILE.rego | policy --reset | stats --metrics URL"
	if len(args) == 0 {
		return errors.New(help)
	}
	sub, rest := args[0], reorder(args[1:])
	fs := flag.NewFlagSet("models "+sub, flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	reset := fs.Bool("reset", false, "policy: restore the shipped routing policy")
	metrics := fs.String("metrics", "http://127.0.0.1:9090/metrics", "stats: a worker's metrics URL (serve --metrics-addr)")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if sub == "stats" {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, *metrics, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %s", *metrics, resp.Status)
		}
		out, err := modeltool.Summarise(resp.Body)
		if err != nil {
			return err
		}
		return printJSON(out)
	}
	store, closeFn, err := openStore(ctx, *url)
	if err != nil {
		return err
	}
	defer closeFn()
	switch {
	case sub == "register" && fs.NArg() == 1:
		doc, err := os.ReadFile(fs.Arg(0))
		if err != nil {
			return err
		}
		m, err := store.PutModel(ctx, doc)
		if err != nil {
			return err
		}
		return printJSON(m)
	case sub == "list":
		ms, err := store.Models(ctx)
		if err != nil {
			return err
		}
		return printJSON(ms)
	case sub == "policy" && (fs.NArg() == 1 || *reset):
		var src []byte
		if !*reset {
			if src, err = os.ReadFile(fs.Arg(0)); err != nil {
				return err
			}
		}
		return store.PutRoutingPolicy(ctx, src)
	case sub == "delete" && fs.NArg() == 1:
		return store.DeleteModel(ctx, fs.Arg(0))
	}
	return errors.New(help)
}

// budgetsCmd shows where a session's budget stands.
func budgetsCmd(ctx context.Context, args []string) error {
	const help = "budgets: show --tenant T --session S [--max-tokens N] [--max-cost X] [--max-calls N] [--max-runtime-ms N]"
	if len(args) == 0 || args[0] != "show" {
		return errors.New(help)
	}
	fs := flag.NewFlagSet("budgets show", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	tenant := fs.String("tenant", "", "tenant (required)")
	session := fs.String("session", "", "session (required): the token's session_id, else the request's")
	var l api.BudgetLimits
	fs.Int64Var(&l.MaxTokens, "max-tokens", 0, "the budget's max_tokens, for what remains")
	fs.Float64Var(&l.MaxCost, "max-cost", 0, "the budget's max_cost")
	fs.Int64Var(&l.MaxCalls, "max-calls", 0, "the budget's max_calls")
	fs.Int64Var(&l.MaxRuntimeMS, "max-runtime-ms", 0, "the budget's max_runtime_ms")
	if err := fs.Parse(reorder(args[1:])); err != nil {
		return err
	}
	if *tenant == "" || *session == "" {
		return errors.New(help)
	}
	c, closeFn, err := connect(*url)
	if err != nil {
		return err
	}
	defer closeFn()
	st, err := c.Budget(ctx, *tenant, *session, l)
	if err != nil {
		return err
	}
	return printJSON(st)
}
