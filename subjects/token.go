package subjects

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Token encodes s as one subject token that is also a valid KV key: bytes
// outside [A-Za-z0-9_-] become =XX (hex). It is reversible with Untoken, so ids
// such as "mcp:fs:read_file" or a CloudEvent id with dots stay distinct.
func Token(s string) string {
	if s == "" {
		return "="
	}
	i := 0
	for i < len(s) && isPlain(s[i]) {
		i++
	}
	if i == len(s) {
		return s // most ids and names: every subject and key of a call takes some
	}
	const digits = "0123456789ABCDEF"
	b := make([]byte, i, len(s)+2*(len(s)-i))
	copy(b, s)
	for ; i < len(s); i++ {
		if c := s[i]; isPlain(c) {
			b = append(b, c)
		} else {
			b = append(b, '=', digits[c>>4], digits[c&0xf])
		}
	}
	return string(b)
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

// Bounds on the names toolgate builds subjects and KV keys from. NATS refuses
// a protocol line over 4,096 bytes by closing the connection, so every name
// that reaches a subject is checked against these before one is built.
const (
	// MaxTenantBytes is the longest tenant token.
	MaxTenantBytes = 64
	// MaxIDBytes is the longest invocation id; Token escapes it to at most
	// three times as many bytes.
	MaxIDBytes = 128
)

// TenantPattern is the form of a tenant, the same as agent_context.tenant_id
// in the invoke-request schema. Tenants starting with "_" (such as
// SystemTenant) are reserved for toolgate.
const TenantPattern = `^[A-Za-z0-9_-]{1,64}$`

// ErrBadName reports a tenant or invocation id that cannot be used in a
// subject or key.
var ErrBadName = errors.New("not usable in a subject")

// CheckTenant reports whether t matches TenantPattern and is not reserved.
// "*", ">" and "." can never pass, so a tenant is always exactly one literal
// subject token.
func CheckTenant(t string) error {
	if t == "" || len(t) > MaxTenantBytes {
		return fmt.Errorf("%w: tenant must be 1 to %d bytes, got %d", ErrBadName, MaxTenantBytes, len(t))
	}
	for i := 0; i < len(t); i++ {
		if !isPlain(t[i]) {
			return fmt.Errorf("%w: tenant may hold only [A-Za-z0-9_-], found %q", ErrBadName, t[i])
		}
	}
	if t[0] == '_' {
		return fmt.Errorf("%w: tenant %q is reserved (names starting with _ are toolgate's)", ErrBadName, t)
	}
	return nil
}

// CheckID reports whether id can be an invocation id: 1 to MaxIDBytes bytes
// of UTF-8 without control characters.
func CheckID(id string) error {
	if id == "" || len(id) > MaxIDBytes {
		return fmt.Errorf("%w: invocation id must be 1 to %d bytes, got %d", ErrBadName, MaxIDBytes, len(id))
	}
	if !utf8.ValidString(id) {
		return fmt.Errorf("%w: invocation id is not UTF-8", ErrBadName)
	}
	for _, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: invocation id holds control character %U", ErrBadName, r)
		}
	}
	return nil
}
