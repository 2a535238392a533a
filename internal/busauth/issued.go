package busauth

import (
	"strings"

	"github.com/nats-io/jwt/v2"
)

// IssuedCredentials reports whether b is a .creds file IssueCredentials
// wrote: its user JWT carries a toolgate role tag. Such a file must be sent
// with CredentialsOption; any other .creds file with nats.UserCredentials.
func IssuedCredentials(b []byte) bool {
	tok, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return false
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return false
	}
	for _, t := range uc.Tags {
		if strings.HasPrefix(t, roleTagPrefix) {
			return true
		}
	}
	return false
}
