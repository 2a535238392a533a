package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// records is a fixed set of status records by invocation id.
type records map[string]api.Record

func (rs records) Status(_ context.Context, _, id string) (api.Record, error) {
	if rec, ok := rs[id]; ok {
		return rec, nil
	}
	return api.Record{}, kvstore.ErrNotFound
}

// TestClassifyLeftovers: what a message left in route's queue is, from its
// invocation's record and the pipeline's newer messages of it.
func TestClassifyLeftovers(t *testing.T) {
	_, js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{}); err != nil {
		t.Fatal(err)
	}
	call := func(id string, seq uint64) *envelope.Invocation {
		return &envelope.Invocation{ID: id, Tenant: "acme", Event: envelope.Event{Seq: seq}, Status: api.StatusPending}
	}
	hand := func(inv *envelope.Invocation, stage string) uint64 {
		o, err := Handoff(inv, stage)
		if err != nil {
			t.Fatal(err)
		}
		f, err := PublishAsync(js, o)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ack := <-f.Ok():
			return ack.Sequence
		case err := <-f.Err():
			t.Fatal(err)
		}
		return 0
	}
	pending := func(inv *envelope.Invocation, st api.Status) api.Record {
		return api.Record{InvocationID: inv.ID, Tenant: inv.Tenant, Status: st, Seq: inv.Event.Seq}
	}
	movedOn, stuck, olderOnly := call("moved-on", 1), call("stuck", 2), call("older-only", 3)
	parked, running, ended := call("parked", 4), call("running", 5), call("ended", 6)
	repeat, expired := call("repeat", 7), call("expired", 8)
	hand(olderOnly, subjects.Authorize) // an earlier hop: not past route
	cases := []struct {
		inv  *envelope.Invocation
		rec  *api.Record
		want string
	}{
		{movedOn, &api.Record{Status: api.StatusPending}, sweptDeleted},
		{stuck, &api.Record{Status: api.StatusPending}, sweptEnded},
		{olderOnly, &api.Record{Status: api.StatusPending}, sweptEnded},
		{parked, &api.Record{Status: api.StatusPendingApproval}, sweptHeld},
		{running, &api.Record{Status: api.StatusRunning}, sweptHeld},
		{ended, &api.Record{Status: api.StatusSuccess}, sweptDeleted},
		{repeat, &api.Record{Status: api.StatusRunning, Seq: 99}, sweptDeleted},
		{expired, nil, sweptDeleted},
	}
	rs := records{}
	seqs := map[string]uint64{}
	for _, c := range cases {
		seqs[c.inv.ID] = hand(c.inv, subjects.Route)
		if c.rec != nil {
			rec := pending(c.inv, c.rec.Status)
			if c.rec.Seq != 0 {
				rec.Seq = c.rec.Seq
			}
			rs[c.inv.ID] = rec
		}
	}
	hand(movedOn, subjects.Execute) // route handed it on before its ack was lost
	r := &Runner{Name: subjects.Route, JS: js, Records: rs, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	in := subjects.InputOf(subjects.Route)
	var later map[string]uint64
	for _, c := range cases {
		t.Run(c.inv.ID, func(t *testing.T) {
			got, err := r.classify(ctx, in, leftover{seq: seqs[c.inv.ID], inv: c.inv}, &later)
			if err != nil || got != c.want {
				t.Fatalf("%q (%v), want %q", got, err, c.want)
			}
		})
	}
	t.Run("at validate, a call never taken ends", func(t *testing.T) {
		v := &Runner{Name: subjects.Validate, JS: js, Records: records{}, Log: r.Log}
		got, err := v.classify(ctx, subjects.InputOf(subjects.Validate), leftover{seq: 1, inv: call("new", 50)}, new(map[string]uint64))
		if err != nil || got != sweptEnded {
			t.Fatalf("%q (%v)", got, err)
		}
	})
}
