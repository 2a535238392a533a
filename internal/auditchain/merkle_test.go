package auditchain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
)

// TestMerkleRFC9162: the roots of the first leaves of RFC 9162's (and
// RFC 6962's) reference test vectors, and every inclusion proof of trees
// of 1 to 40 leaves verifying, and failing for another leaf or index.
func TestMerkleRFC9162(t *testing.T) {
	inputs := []string{"", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"}
	roots := []string{
		"6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
		"fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
		"aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
		"d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
		"4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
		"76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
		"ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
		"5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
	}
	var leaves []Hash
	for i, in := range inputs {
		b, _ := hex.DecodeString(in)
		leaves = append(leaves, sha256.Sum256(append([]byte{0}, b...)))
		r := Root(leaves)
		if got := hex.EncodeToString(r[:]); got != roots[i] {
			t.Fatalf("root of %d leaves: %s, want %s", i+1, got, roots[i])
		}
	}
	for n := 1; n <= 40; n++ {
		var ls []Hash
		for i := range n {
			ls = append(ls, LeafHash("audit.t.e", fmt.Appendf(nil, "%d", i)))
		}
		root := Root(ls)
		for m := range n {
			p := InclusionProof(m, ls)
			if err := VerifyInclusion(ls[m], uint64(m), uint64(n), p, root); err != nil {
				t.Fatalf("n=%d m=%d: %v", n, m, err)
			}
			if n > 1 {
				if VerifyInclusion(ls[(m+1)%n], uint64(m), uint64(n), p, root) == nil {
					t.Fatalf("n=%d m=%d: proof verifies another leaf", n, m)
				}
				if VerifyInclusion(ls[m], uint64((m+1)%n), uint64(n), p, root) == nil && ls[m] != ls[(m+1)%n] {
					t.Fatalf("n=%d m=%d: proof verifies at another index", n, m)
				}
			}
		}
	}
}
