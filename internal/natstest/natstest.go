// Package natstest starts what tests need from NATS: an in-process server
// with JetStream on a random port and a temporary store, a connection to it,
// and a helper that waits on a condition instead of sleeping.
//
// Everything it starts is stopped by t.Cleanup.
package natstest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server starts an embedded NATS server with JetStream on 127.0.0.1 and a
// random port, storing under t.TempDir(). It is shut down when t ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	// The store's limit is fixed: by default it is three quarters of the
	// disk's free space, less on a busy machine than the streams a
	// topology reserves (their MaxBytes), which tests never fill.
	return ServerWithStore(t, server.JetStreamMaxStoreDefault)
}

// ServerWithStore is Server with a store that can reserve maxStore bytes,
// as a server started on a disk with little free space has.
func ServerWithStore(t testing.TB, maxStore int64) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), JetStreamMaxStore: maxStore, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("nats server did not start")
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// Connect connects to url; the connection is closed when t ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream starts a server (see Server) and returns a connection to it and
// its JetStream context.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := Connect(t, Server(t).ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// Eventually waits until cond returns true, checking every few milliseconds,
// and fails t if it has not within timeout; what, if given, names the
// condition in the failure.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, what ...string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			if len(what) > 0 {
				t.Fatalf("timed out after %s waiting for %s", timeout, strings.Join(what, " "))
			}
			t.Fatalf("condition not met within %s", timeout)
		}
		<-tick.C
	}
}
