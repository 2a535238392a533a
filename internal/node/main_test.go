package node_test

import (
	"github.com/toolgate/toolgate/internal/sandbox"
	"os"
	"testing"
)

// TestMain lets this test binary serve as the egress forwarder of networked
// sandboxes, as the toolgate binary does.
func TestMain(m *testing.M) {
	sandbox.ForwarderMain()
	os.Exit(m.Run())
}
