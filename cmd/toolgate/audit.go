package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/auditexport"
)

// auditCmd: toolgate audit export [--since T] [--until T] [--tenant T] > file.jsonl
func auditCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "export" {
		return errors.New("audit: export [--since 2026-01-01T00:00:00Z | --since 720h] [--until T] [--tenant T] > audit.jsonl")
	}
	fs := flag.NewFlagSet("audit export", flag.ContinueOnError)
	url := fs.String("nats", natsURL(), "NATS server URL (default: $NATS_URL, else "+nats.DefaultURL+")")
	since := fs.String("since", "", "earliest event: an RFC 3339 time or a duration back from now (720h); default: the first")
	until := fs.String("until", "", "first time not exported: RFC 3339 or a duration back from now; default: now")
	tenant := fs.String("tenant", "", "only this tenant's events")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	var o auditexport.Options
	var err error
	if o.Since, err = pointInTime(*since); err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	if o.Until, err = pointInTime(*until); err != nil {
		return fmt.Errorf("--until: %w", err)
	}
	o.Tenant = *tenant
	nc, err := nats.Connect(*url, nats.Name("toolgate-audit-export"))
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", *url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	n, err := auditexport.Export(ctx, js, os.Stdout, o)
	fmt.Fprintf(os.Stderr, "%d audit events exported\n", n)
	return err
}

// pointInTime reads an RFC 3339 time or a duration before now; "" is zero.
func pointInTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Parse(time.RFC3339, s)
}
