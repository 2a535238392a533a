package sandbox

import (
	"os"
	"testing"
)

// TestMain lets this test binary serve as the egress forwarder of networked
// runs, as the toolgate binary does.
func TestMain(m *testing.M) {
	ForwarderMain()
	os.Exit(m.Run())
}
