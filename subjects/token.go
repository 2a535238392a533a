package subjects

import (
	"fmt"
	"strings"
)

// Token encodes s as one subject token that is also a valid KV key: bytes
// outside [A-Za-z0-9_-] become =XX (hex). It is reversible with Untoken, so ids
// such as "mcp:fs:read_file" or a CloudEvent id with dots stay distinct.
func Token(s string) string {
	if s == "" {
		return "="
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isPlain(c) {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	return b.String()
}

// Untoken reverses Token.
func Untoken(t string) (string, error) {
	if t == "=" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c == '=':
			if i+2 >= len(t) {
				return "", fmt.Errorf("truncated escape in %q", t)
			}
			hi, lo := unhex(t[i+1]), unhex(t[i+2])
			if hi < 0 || lo < 0 || isPlain(byte(hi<<4|lo)) {
				// Only the canonical form decodes, so Token stays injective.
				return "", fmt.Errorf("bad escape in %q", t)
			}
			b.WriteByte(byte(hi<<4 | lo))
			i += 2
		case isPlain(c):
			b.WriteByte(c)
		default:
			return "", fmt.Errorf("byte %q not allowed in token %q", c, t)
		}
	}
	return b.String(), nil
}

func isPlain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
