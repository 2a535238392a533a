package signedstate

import (
	"strconv"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
)

func signedAt(at time.Time) *api.DecisionProof {
	return &api.DecisionProof{Headers: map[string][]string{busauth.HeaderSignedAt: {strconv.FormatInt(at.UnixMilli(), 10)}}}
}

func TestOrder(t *testing.T) {
	t0 := time.Now()
	old, newer, newest := signedAt(t0), signedAt(t0.Add(time.Second)), signedAt(t0.Add(2*time.Second))
	var o Order
	steps := []struct {
		name string
		do   func() error
		ok   bool
	}{
		{"the first record", func() error { return o.Admit("policy", newer) }, true},
		{"the same record again (a watch seeing it twice)", func() error { return o.Admit("policy", newer) }, true},
		{"an older request written back", func() error { return o.Admit("policy", old) }, false},
		{"an older request under another key", func() error { return o.Admit("hooks/acme", old) }, true},
		{"a newer request", func() error { return o.Admit("policy", newest) }, true},
		{"the previous one again", func() error { return o.Admit("policy", newer) }, false},
		{"the record in force, after its removal", func() error { o.Removed("policy"); return o.Admit("policy", newest) }, false},
		{"one signed after the removal", func() error { return o.Admit("policy", signedAt(t0.Add(3*time.Second))) }, true},
		{"a record that does not say when", func() error { return o.Admit("policy", &api.DecisionProof{}) }, true},
	}
	for _, s := range steps {
		if err := s.do(); (err == nil) != s.ok {
			t.Fatalf("%s: %v, want ok=%v", s.name, err, s.ok)
		}
	}
}
