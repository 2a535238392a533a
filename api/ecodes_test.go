package api

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
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

// TestToolErrorCodesMapped: docs/errors.md's table of ToolErrorCode strings
// lists, under each string, exactly the E-codes whose row carries it.
func TestToolErrorCodesMapped(t *testing.T) {
	doc, err := os.ReadFile("../docs/errors.md")
	if err != nil {
		t.Fatal(err)
	}
	type pair struct{ code, ecode string }
	rows := map[pair]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\| (E\d{4}) \| ([^|]*) \|`).FindAllSubmatch(doc, -1) {
		for _, c := range regexp.MustCompile(`\b[a-z]+(?:_[a-z]+)+\b|\b(?:timeout|cancelled|any)\b`).FindAll(m[2], -1) {
			rows[pair{string(c), string(m[1])}] = true
		}
	}
	_, section, ok := strings.Cut(string(doc), "### The specification's ToolErrorCode strings")
	if !ok {
		t.Fatal("docs/errors.md has no section on the ToolErrorCode strings")
	}
	mapped := map[pair]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| ((?:`[a-z_]+`(?:, )?)+|any) \\| (.*) \\|$").FindAllStringSubmatch(section, -1) {
		codes := regexp.MustCompile("[a-z_]+").FindAllString(m[1], -1)
		var ecodes []string
		for _, r := range regexp.MustCompile(`E(\d{4})(?:-E(\d{4}))?`).FindAllStringSubmatch(m[2], -1) {
			from, _ := strconv.Atoi(r[1])
			to := from
			if r[2] != "" {
				to, _ = strconv.Atoi(r[2])
			}
			for n := from; n <= to; n++ {
				ecodes = append(ecodes, fmt.Sprintf("E%d", n))
			}
		}
		// A row of several strings pairs them with its E-codes in order.
		if len(codes) > 1 {
			if len(codes) != len(ecodes) {
				t.Fatalf("row %q: %d strings, %d E-codes", m[0], len(codes), len(ecodes))
			}
			for i := range codes {
				mapped[pair{codes[i], ecodes[i]}] = true
			}
			continue
		}
		for _, e := range ecodes {
			mapped[pair{codes[0], e}] = true
		}
	}
	for p := range rows {
		if !mapped[p] && p.code != "cancelled" && p.code != "invocation_not_found" {
			t.Errorf("%s carries %s, which the ToolErrorCode table does not list under it", p.ecode, p.code)
		}
	}
	for p := range mapped {
		if !rows[p] {
			t.Errorf("the ToolErrorCode table lists %s under %s, whose row does not carry it", p.ecode, p.code)
		}
	}
}
