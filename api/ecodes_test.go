package api

import (
	"os"
	"regexp"
	"testing"
)

// TestECodesDocumented: every E-code of ecodes.go has its row in
// docs/errors.md, and every row names a code that exists.
func TestECodesDocumented(t *testing.T) {
	src, err := os.ReadFile("ecodes.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`"(E\d{4})"`).FindAllSubmatch(src, -1) {
		defined[string(m[1])] = true
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\| (E\d{4}) \|`).FindAllSubmatch(doc, -1) {
		rows[string(m[1])] = true
	}
	for c := range defined {
		if !rows[c] {
			t.Errorf("%s is defined in api/ecodes.go but has no row in docs/errors.md", c)
		}
	}
	for c := range rows {
		if !defined[c] {
			t.Errorf("docs/errors.md has a row for %s, which api/ecodes.go does not define", c)
		}
	}
}
