package auditchain

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// seedExport is a small export of two events under one checkpoint, made
// as Export writes it.
func seedExport(k ed25519.PrivateKey) []byte {
	evs := []Event{
		{Seq: 1, Subject: "audit.acme.tool.succeeded", Data: []byte(`{"id":"a-1"}`), Time: time.Unix(1, 0)},
		{Seq: 2, Subject: "audit.globex.tool.failed", Data: []byte(`{"id":"g-1"}`), Time: time.Unix(2, 0)},
	}
	leaves := []Hash{LeafHash(evs[0].Subject, evs[0].Data), LeafHash(evs[1].Subject, evs[1].Data)}
	root := Root(leaves)
	var prefixes []byte
	for _, l := range leaves {
		prefixes = append(prefixes, l[:prefixLen]...)
	}
	cp := &Checkpoint{V: Version, Stream: "AUDIT", StreamCreated: "2026-01-01T00:00:00Z", First: 1, Last: 2,
		Root: hex.EncodeToString(root[:]), Time: "2026-01-01T00:00:05Z", FirstTime: "2026-01-01T00:00:01Z",
		LastTime: "2026-01-01T00:00:02Z", Writer: "w", Leaves: base64.StdEncoding.EncodeToString(prefixes),
		IDs: []string{"a-1", "g-1"}, Tenants: []string{"acme", "globex"}}
	cp.Sign(k)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	_ = enc.Encode(fileLine{Kind: lineHeader, V: FileVersion, StreamCreated: cp.StreamCreated, First: 1, Last: 2, ChainFirst: 1, Exists: true})
	data, _ := json.Marshal(cp)
	_ = enc.Encode(fileLine{Kind: lineCheckpoint, Seq: 1, Data: data})
	for i, e := range evs {
		p := &fileProof{Checkpoint: 1, Index: uint64(i), Size: 2}
		for _, h := range InclusionProof(i, leaves) {
			p.Path = append(p.Path, hex.EncodeToString(h[:]))
		}
		_ = enc.Encode(fileLine{Kind: lineEvent, Seq: e.Seq, Subject: e.Subject, Time: e.Time.UTC().Format(time.RFC3339Nano), Data: e.Data, Proof: p})
	}
	return b.Bytes()
}

// FuzzReadFile: any file decodes or is refused without panicking, and
// whatever decodes can be verified without panicking; the seed export
// verifies intact.
func FuzzReadFile(f *testing.F) {
	k := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	seed := seedExport(k)
	f.Add(seed)
	f.Add(bytes.Replace(seed, []byte(`"seq":2`), []byte(`"seq":1`), 1))
	f.Add([]byte(`{"kind":"header","v":1}` + "\n" + `{"kind":"event","seq":1,"time":"x"}`))
	f.Add([]byte(`{"kind":"header","v":1,"tenant":"acme"}` + "\n" + `{"kind":"checkpoint","seq":3,"data":"e30="}`))
	pub := k.Public().(ed25519.PublicKey)
	if fl, err := ReadFile(bytes.NewReader(seed)); err != nil {
		f.Fatal(err)
	} else if r, err := Verify(context.Background(), fl, Options{Key: pub}); err != nil || !r.Intact() || r.Events != 2 {
		f.Fatalf("seed export: %+v %v", r, err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := ReadFile(bytes.NewReader(b))
		if err != nil {
			return
		}
		r, err := Verify(context.Background(), fl, Options{Key: pub, Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		_ = fmt.Sprint(r.Findings)
	})
}
