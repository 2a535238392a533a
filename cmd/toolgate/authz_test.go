package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestKeygenRefusesToReplaceKeys: an existing key or key set is kept unless
// --force is given, since a new key invalidates every token issued.
func TestKeygenRefusesToReplaceKeys(t *testing.T) {
	dir := t.TempDir()
	key, jwks := filepath.Join(dir, "k.jwk"), filepath.Join(dir, "jwks.json")
	args := []string{"--out", key, "--jwks", jwks}
	if err := tokenKeygen(args); err != nil {
		t.Fatal(err)
	}
	oldKey, _ := os.ReadFile(key)
	oldSet, _ := os.ReadFile(jwks)
	if err := tokenKeygen(args); err == nil {
		t.Fatal("keygen replaced an existing key without --force")
	}
	// Only the key set left: still refused, nothing written.
	if err := os.Remove(key); err != nil {
		t.Fatal(err)
	}
	if err := tokenKeygen(args); err == nil {
		t.Fatal("keygen replaced an existing key set without --force")
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Fatal("a refused keygen wrote the key")
	}
	if set, _ := os.ReadFile(jwks); !bytes.Equal(set, oldSet) {
		t.Fatal("a refused keygen changed the key set")
	}
	if err := tokenKeygen(append([]string{"--force"}, args...)); err != nil {
		t.Fatal(err)
	}
	if newKey, _ := os.ReadFile(key); len(newKey) == 0 || bytes.Equal(newKey, oldKey) {
		t.Fatal("--force did not write a new key")
	}
	if set, _ := os.ReadFile(jwks); bytes.Equal(set, oldSet) {
		t.Fatal("--force did not write a new key set")
	}
}
