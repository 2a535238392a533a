package policy

import (
	"context"
	"testing"
)

func TestDocumentPolicy(t *testing.T) {
	ctx := context.Background()
	d, err := DefaultDocuments(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := DocumentInput{AgentDID: "did:agent:a", Tenant: "acme", Source: "handbook", DocumentID: "x", AccessMode: "read"}
	if ok, why, err := d.Allow(ctx, in); err != nil || !ok {
		t.Fatalf("default: %v %v %v", ok, why, err)
	}
	in.SourceTenants = []string{"other"}
	if ok, why, _ := d.Allow(ctx, in); ok || len(why) == 0 {
		t.Fatalf("a source of another tenant: %v %v", ok, why)
	}
	own := `package toolgate.documents
decision := {"allow": false, "reasons": ["secret"]} if input.document_id == "secret"
decision := {"allow": true} if input.document_id != "secret"
`
	d, err = NewDocuments(ctx, map[string]string{"docs.rego": own, "default.rego": DefaultModule()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	in.SourceTenants = nil
	if ok, _, _ := d.Allow(ctx, in); !ok {
		t.Fatal("the pushed module replaces the shipped one: x is allowed")
	}
	in.DocumentID = "secret"
	if ok, why, _ := d.Allow(ctx, in); ok || why[0] != "secret" {
		t.Fatalf("secret: %v %v", ok, why)
	}
}
