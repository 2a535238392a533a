package policy

import (
	"context"
	_ "embed"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/toolgate/toolgate/api"
)

// DocumentQuery is the rule the document bridge asks about each document.
const DocumentQuery = "data.toolgate.documents.decision"

const documentsPackage = "toolgate.documents"

//go:embed documents.rego
var documentsModule string

// DocumentInput is what a document decision is made on.
type DocumentInput struct {
	AgentDID      string   `json:"agent_did"`
	Tenant        string   `json:"tenant"`
	ToolID        string   `json:"tool_id"`
	Source        string   `json:"source"`
	SourceTenants []string `json:"source_tenants"`
	DocumentID    string   `json:"document_id"`
	Version       string   `json:"version"`
	AccessMode    string   `json:"access_mode"`
}

// Documents decides which documents an agent may read. Safe for
// concurrent use.
type Documents struct {
	query rego.PreparedEvalQuery
}

// NewDocuments prepares the document decision of a pushed bundle (modules
// and data, as New takes them). A bundle without a module of package
// toolgate.documents gets the shipped one beside its own.
func NewDocuments(ctx context.Context, modules map[string]string, data map[string]any) (*Documents, error) {
	if data == nil {
		data = map[string]any{}
	}
	opts := []func(*rego.Rego){
		rego.Query(DocumentQuery),
		rego.Capabilities(capabilities()),
		rego.Store(inmem.NewFromObject(data)),
	}
	own := false
	for name, src := range modules {
		if m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1}); err == nil &&
			m.Package.Path.String() == "data."+documentsPackage {
			own = true
		}
		opts = append(opts, rego.Module(name, src))
	}
	if !own {
		opts = append(opts, rego.Module("toolgate-documents.rego", documentsModule))
	}
	q, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EPolicyFailed, "document policy does not compile: %v", err)
	}
	return &Documents{query: q}, nil
}

// DefaultDocuments is the shipped document policy alone.
func DefaultDocuments(ctx context.Context) (*Documents, error) {
	return NewDocuments(ctx, nil, nil)
}

// Allow evaluates the decision for in: allowed, or the reasons it is not.
// An undefined or malformed decision is a denial.
func (d *Documents) Allow(ctx context.Context, in DocumentInput) (bool, []string, error) {
	if in.SourceTenants == nil {
		in.SourceTenants = []string{}
	}
	rs, err := d.query.Eval(ctx, rego.EvalInput(in))
	if err != nil {
		return false, nil, api.WrapError(err, api.InternalError, api.EPolicyFailed, "evaluating the document policy: %v", err)
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return false, []string{"the document policy defines no decision for this document"}, nil
	}
	obj, _ := rs[0].Expressions[0].Value.(map[string]any)
	allow, ok := obj["allow"].(bool)
	if !ok {
		return false, []string{"the document policy's decision has no boolean allow"}, nil
	}
	var reasons []string
	if list, ok := obj["reasons"].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				reasons = append(reasons, s)
			}
		}
	}
	if !allow && len(reasons) == 0 {
		reasons = []string{"denied by the document policy"}
	}
	return allow, reasons, nil
}
