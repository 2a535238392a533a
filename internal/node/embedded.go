// Package node wires toolgate together: an optional embedded NATS
// server, the streams and buckets, the tool registry, the six stages and
// their runners, the control services, metrics and tracing.
package node

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedOptions configure the in-process NATS server.
type EmbeddedOptions struct {
	// Listen is host:port; port -1 picks a free one.
	Listen string
	// DataDir holds JetStream's file storage.
	DataDir string
	// MaxPayload is the largest message the server accepts (default 8 MiB,
	// above validate's default event limit so oversized events are rejected
	// with an answer rather than refused at publish).
	MaxPayload int32
	// Logging turns on the server's own log on stderr.
	Logging bool
	// SyncAlways makes the store fsync every write before acknowledging
	// it (nats-server's sync_interval: always).
	SyncAlways bool
	// SyncInterval is how often the store is fsynced when SyncAlways is
	// off (0: nats-server's default, 2 minutes). Writes acknowledged since
	// the last fsync are in the page cache only: a crash of the process
	// keeps them, a power cut of the machine may not.
	SyncInterval time.Duration
	// LeafListen is host:port where the hub accepts its sites' leaf-node
	// connections (docs/sites.md); empty accepts none.
	LeafListen string
}

// StartEmbedded starts a NATS server with JetStream in this process and waits
// until it accepts connections. It has no authentication: it is for tests
// of what lies behind the bus; serve uses StartSecureEmbedded.
func StartEmbedded(o EmbeddedOptions) (*server.Server, error) {
	host, portStr, err := splitListen(o.Listen)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("listen port %q: %w", portStr, err)
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = 8 << 20
	}
	ns, err := server.NewServer(&server.Options{
		ServerName:   "toolgate",
		Host:         host,
		Port:         port,
		JetStream:    true,
		StoreDir:     o.DataDir,
		MaxPayload:   o.MaxPayload,
		SyncAlways:   o.SyncAlways,
		SyncInterval: o.SyncInterval,
		NoSigs:       true,
		NoLog:        !o.Logging,
	})
	if err != nil {
		return nil, fmt.Errorf("configuring embedded NATS: %w", err)
	}
	if o.Logging {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded NATS did not start listening on %s", o.Listen)
	}
	return ns, nil
}

func splitListen(listen string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(listen)
	if err != nil {
		return "", "", fmt.Errorf("listen address %q: %w", listen, err)
	}
	return host, port, nil
}
