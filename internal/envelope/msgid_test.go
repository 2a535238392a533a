package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
)

// TestMsgIDStable: the message ids are the ones earlier builds made, so a
// message redelivered across an upgrade is still deduplicated.
func TestMsgIDStable(t *testing.T) {
	for _, inv := range []*Invocation{
		{Tenant: "acme", ID: "inv-1", Event: Event{Seq: 7}},
		{Tenant: "", ID: "", Event: Event{Seq: 0}},
		{Tenant: strings.Repeat("t", 100), ID: strings.Repeat("i", 200), Event: Event{Seq: 1<<64 - 1}},
	} {
		check := func() {
			t.Helper()
			sum := sha256.Sum256([]byte(inv.Tenant + "\x00" + inv.ID))
			want := fmt.Sprintf("%d.%s.%s", inv.Event.Seq, hex.EncodeToString(sum[:8]), "route")
			if got := inv.MsgID("route"); got != want {
				t.Errorf("MsgID = %q, want %q", got, want)
			}
		}
		check()
		check() // the digest made once
		// An invocation whose tenant or id changed names them.
		inv.ID += "x"
		check()
		inv.Tenant += "y"
		check()
		inv.Tenant, inv.ID = "", ""
		check()
	}
}
