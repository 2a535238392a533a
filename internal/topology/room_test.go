package topology_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/natstest"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// serverJS is a server whose store can reserve maxStore bytes (0: a
// fixed 1 TiB, whatever the disk's free space), and JetStream on it.
func serverJS(t *testing.T, maxStore int64) jetstream.JetStream {
	t.Helper()
	if maxStore == 0 {
		maxStore = server.JetStreamMaxStoreDefault
	}
	js, err := jetstream.New(natstest.Connect(t, natstest.ServerWithStore(t, maxStore).ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestStreamsFitTheStore: on a server whose store cannot reserve the
// default byte limits, the streams are made with the defaults lowered
// together to fit the room the store reports, a limit the operator set is
// kept, and without the room known the refusal says what to do.
func TestStreamsFitTheStore(t *testing.T) {
	const room = 1 << 30
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("room unknown", func(t *testing.T) {
		err := topology.EnsureTopology(ctx, serverJS(t, room), topology.TopologyOptions{})
		if err == nil || !strings.Contains(err.Error(), "no room for its byte limit") {
			t.Fatalf("EnsureTopology on a 1 GiB store: %v, want a refusal that names the store's room", err)
		}
	})

	t.Run("room known", func(t *testing.T) {
		js := serverJS(t, room)
		const invoke = 200 << 20
		if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{StoreRoom: room, InvokeMaxBytes: invoke}); err != nil {
			t.Fatal(err)
		}
		var total int64
		lister := js.ListStreams(ctx)
		for info := range lister.Info() {
			c := info.Config
			if c.Storage == jetstream.FileStorage && c.MaxBytes > 0 {
				total += c.MaxBytes
			}
			switch c.Name {
			case subjects.StreamInvoke:
				if c.MaxBytes != invoke {
					t.Errorf("%s: limit %d, want the %d set", c.Name, c.MaxBytes, invoke)
				}
			case subjects.StreamAudit:
				if c.MaxBytes >= topology.DefaultAuditMaxBytes || c.MaxBytes < topology.MinStreamBytes {
					t.Errorf("%s: limit %d, want one lowered from %d", c.Name, c.MaxBytes, topology.DefaultAuditMaxBytes)
				}
			}
		}
		if err := lister.Err(); err != nil {
			t.Fatal(err)
		}
		if total > room {
			t.Fatalf("the streams reserve %d bytes of a %d-byte store", total, room)
		}
		// A second process, or a restart, finds them all and makes none.
		if err := topology.EnsureTopology(ctx, js, topology.TopologyOptions{StoreRoom: 1}); err != nil {
			t.Fatal(err)
		}
		// What the fit left over takes a site's outbox or two; past that,
		// a site's refusal names the cause as the topology's does.
		err := topology.EnsureSites(ctx, js, topology.TopologyOptions{}, []string{"s1", "s2", "s3", "s4"})
		if err == nil || !strings.Contains(err.Error(), "no room for its byte limit") {
			t.Fatalf("four site outboxes in what the fit left of a 1 GiB store: %v, want a refusal that names the store's room", err)
		}
	})
}
