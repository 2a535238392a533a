package node_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/seal"
	"github.com/toolgate/toolgate/kvstore"
)

// executeCheckpoints is the store the execute stage writes checkpoints
// with: its credentials, and its signing key.
func executeCheckpoints(t *testing.T, s *served) *kvstore.Store {
	t.Helper()
	st, _ := roleStore(t, s, busauth.RoleExecute)
	pubs, err := busauth.LoadHopPublicKeys(s.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	st.SignCheckpoints(s.hopSigner(t, busauth.RoleExecute).SignCheckpoint, seal.NewMessages(pubs).CheckpointSigned)
	return st
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
