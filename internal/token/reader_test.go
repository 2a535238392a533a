package token

import (
	"errors"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// TestAttenuateTenantReader: seeing the whole tenant is never inherited
// by default, and a child of a token without it cannot gain it.
func TestAttenuateTenantReader(t *testing.T) {
	plain := baseClaims(time.Hour)
	plain.ID = "plain"
	if _, err := Attenuate(&plain, Claims{TenantReader: true}); !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EAttenuationWidens}) {
		t.Fatalf("a plain token's child asking for tenant_reader: %v, want E3216", err)
	}
	reader := baseClaims(time.Hour)
	reader.ID, reader.TenantReader = "reader", true
	if c, err := Attenuate(&reader, Claims{}); err != nil || c.TenantReader {
		t.Fatalf("a reader's child that does not ask: reader %v, %v", c.TenantReader, err)
	}
	if c, err := Attenuate(&reader, Claims{TenantReader: true}); err != nil || !c.TenantReader {
		t.Fatalf("a reader's child that asks: reader %v, %v", c.TenantReader, err)
	}
}
