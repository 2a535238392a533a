// Package schemas holds toolgate's JSON Schemas (draft 2020-12) and the
// helpers that compile schemas and turn validation failures into
// api.FieldErrors.
//
// The tool manifest and ToolInvokeRequest schemas are embedded and compiled
// once, on first use. Tool input and output schemas are user data: Compile
// refuses to fetch anything, so registering a manifest never touches the
// network or the file system.
package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v5"
	segjson "github.com/segmentio/encoding/json"
	"github.com/toolgate/toolgate/api"
)

// MaxFieldErrors bounds the field errors Fields returns, so a huge invalid
// document cannot produce a huge error response.
const MaxFieldErrors = 50

// baseURL prefixes the $id of the embedded schemas.
const baseURL = "https://github.com/toolgate/toolgate/schemas/"

//go:embed *.schema.json
var files embed.FS

var (
	manifestSchema = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("tool-manifest.schema.json") })
	invokeSchema   = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("invoke-request.schema.json") })
	rulesSchema    = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("detector-rules.schema.json") })
	modelSchema    = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("model.schema.json") })
	hookSetSchema  = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("hook-set.schema.json") })
	capSchema      = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("capability-request.schema.json") })
	seedSchema     = sync.OnceValue(func() *jsonschema.Schema { return mustCompileEmbedded("tool-manifest-seed.schema.json") })
)

// CapabilityRequest returns the compiled capability request schema.
func CapabilityRequest() *jsonschema.Schema { return capSchema() }

// MCPContent is the output schema of an mcp tool whose server declares
// none: {"content": [items]}.
func MCPContent() json.RawMessage {
	b, err := files.ReadFile("mcp-content.schema.json")
	if err != nil {
		panic(fmt.Sprintf("schemas: %v", err)) // embedded: a build defect
	}
	return b
}

// DetectorRules returns the compiled schema of a detector rule set.
func DetectorRules() *jsonschema.Schema { return rulesSchema() }

// Model returns the compiled model catalogue entry schema.
func Model() *jsonschema.Schema { return modelSchema() }

// HookSet is the schema of a set of hooks: a tenant's (toolgate hooks push)
// and, wrapped as {"hooks": [...]}, a manifest's hooks field.
func HookSet() *jsonschema.Schema { return hookSetSchema() }

// SeedManifest returns the compiled schema of a tool manifest in the
// specification's form (seed 002, 5.2.1), which tools.Parse converts into
// toolgate's own.
func SeedManifest() *jsonschema.Schema { return seedSchema() }

// Manifest returns the compiled tool manifest schema.
func Manifest() *jsonschema.Schema { return manifestSchema() }

// InvokeRequest returns the compiled ToolInvokeRequest schema.
func InvokeRequest() *jsonschema.Schema { return invokeSchema() }

// mustCompileEmbedded panics because an embedded schema that does not compile
// is a build defect, caught by the package tests.
func mustCompileEmbedded(file string) *jsonschema.Schema {
	b, err := files.ReadFile(file)
	if err != nil {
		panic(fmt.Sprintf("schemas: %v", err))
	}
	c := newCompiler()
	if err := c.AddResource(baseURL+file, bytes.NewReader(b)); err != nil {
		panic(fmt.Sprintf("schemas: %s: %v", file, err))
	}
	return c.MustCompile(baseURL + file)
}

// newCompiler returns a compiler that defaults to draft 2020-12, checks
// formats (a tool that declares "format": "uri" wants it enforced) and loads
// nothing from outside: the draft meta-schemas are built into the library and
// every other reference is refused.
func newCompiler() *jsonschema.Compiler {
	c := jsonschema.NewCompiler()
	c.Draft = jsonschema.Draft2020
	c.AssertFormat = true
	c.LoadURL = func(s string) (io.ReadCloser, error) {
		return nil, fmt.Errorf("schema reference %q not allowed: only local references are resolved", s)
	}
	return c
}

// Compile compiles a user-supplied JSON Schema, such as a tool's input or
// output schema. name only labels the schema in error messages. A schema
// without $schema is read as draft 2020-12. The error unwraps to a
// *jsonschema.ValidationError when the schema breaks its meta-schema, so
// Fields can locate the problem.
func Compile(name string, schema []byte) (*jsonschema.Schema, error) {
	// A private URL per compilation: relative references resolve against it
	// and cannot reach another tool's schema.
	u := (&url.URL{Scheme: "mem", Host: "toolgate", Path: "/" + name}).String()
	if selfWithQuery(u, schema) {
		return nil, fmt.Errorf("schema %s: its $id names the schema itself with an empty query (\"?\"), which is not supported", name)
	}
	c := newCompiler()
	if err := c.AddResource(u, bytes.NewReader(schema)); err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	s, err := c.Compile(u)
	if err != nil {
		return nil, fmt.Errorf("schema %s: %w", name, err)
	}
	return s, nil
}

// selfWithQuery reports a root $id (id in draft 4) that resolves to u
// itself with an empty query: the library's compiler recurses on it until
// the stack overflows, which ends the process.
func selfWithQuery(u string, schema []byte) bool {
	var root map[string]any
	if json.Unmarshal(schema, &root) != nil {
		return false
	}
	base, err := url.Parse(u)
	if err != nil {
		return false
	}
	for _, key := range []string{"$id", "id"} {
		id, ok := root[key].(string)
		if !ok {
			continue
		}
		ref, err := url.Parse(id)
		if err != nil {
			continue
		}
		r := base.ResolveReference(ref)
		if r.RawQuery == "" && (r.ForceQuery || strings.Contains(id, "?")) {
			r.ForceQuery, r.Fragment, r.RawFragment = false, "", ""
			if r.String() == u {
				return true
			}
		}
	}
	return false
}

// Validate validates the JSON document doc against s. It returns the
// field-level problems, or nil when doc is valid. The error is for documents
// that are not JSON at all (or, rarely, a schema that loops forever).
func Validate(s *jsonschema.Schema, doc []byte) ([]api.FieldError, error) {
	if wellFormed(doc) && vouchJSON(s, doc) {
		return nil, nil
	}
	return byLibrary(s, doc, decode)
}

// ValidateJSON is Validate of a document encoding/json's scanner has found
// valid JSON already, in this process (envelope.FromMessage refuses event
// data that is not): that scan, most of what Validate costs on a valid
// request, is not made again. What vouchJSON does not vouch for goes to
// the library through decode, which scans.
func ValidateJSON(s *jsonschema.Schema, doc []byte) ([]api.FieldError, error) {
	if utf8.Valid(doc) && vouchJSON(s, doc) {
		return nil, nil
	}
	return byLibrary(s, doc, decode)
}

// byLibrary is Validate by the JSON Schema library alone, on the value
// dec makes of doc.
func byLibrary(s *jsonschema.Schema, doc []byte, dec func([]byte) (any, error)) ([]api.FieldError, error) {
	v, err := dec(doc)
	if err != nil {
		return nil, err
	}
	err = s.Validate(v)
	if err == nil {
		return nil, nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return nil, err
	}
	return Fields(ve), nil
}

// decode reads exactly one JSON value. Numbers stay json.Number so that
// integers beyond 2^53 keep their precision for integer and range checks.
// A document encoding/json's scanner finds valid and that is valid UTF-8
// (every request validate reads, on every call) is read by
// github.com/segmentio/encoding/json, several times faster, to the same
// value (FuzzDecode holds it to that); anything else, or anything it
// refuses or panics on, is read by encoding/json, whose verdict stands.
func decode(doc []byte) (any, error) {
	if wellFormed(doc) {
		if v, ok := decodeFast(doc); ok {
			return v, nil
		}
	}
	return decodeStd(doc)
}

// wellFormed reports a document that is valid JSON and valid UTF-8.
func wellFormed(doc []byte) bool { return json.Valid(doc) && utf8.Valid(doc) }

func decodeFast(doc []byte) (v any, ok bool) {
	defer func() {
		if recover() != nil {
			v, ok = nil, false
		}
	}()
	rest, err := segjson.Parse(doc, &v, segjson.UseNumber)
	if err != nil || len(bytes.TrimLeft(rest, " \t\r\n")) > 0 {
		return nil, false
	}
	return v, true
}

// decodeStd is decode by encoding/json alone.
func decodeStd(doc []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: data after the top-level value")
	}
	return v, nil
}

// Fields converts a validation failure into field errors, one per concrete
// problem, at most MaxFieldErrors. It returns nil if err does not wrap a
// *jsonschema.ValidationError.
func Fields(err error) []api.FieldError {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return nil
	}
	type key struct{ loc, msg string }
	seen := map[key]bool{}
	var out []api.FieldError
	for _, e := range ve.BasicOutput().Errors {
		if isWrapper(e.Error) {
			continue
		}
		loc := e.InstanceLocation
		if loc == "" {
			loc = "/"
		}
		k := key{loc, e.Error}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, api.FieldError{Location: loc, Message: e.Error})
		if len(out) == MaxFieldErrors {
			break
		}
	}
	if len(out) == 0 {
		// Every entry was a wrapper; still say something rather than nothing.
		out = append(out, api.FieldError{Location: "/", Message: ve.Error()})
	}
	return out
}

// isWrapper reports whether msg belongs to an entry that only groups the
// entries after it: the library's unnamed wrappers, the "doesn't validate
// with" of the root schema and of each $ref, and allOf / if-then / if-else,
// whose causes carry the real message.
func isWrapper(msg string) bool {
	switch msg {
	case "", "allOf failed", "if-then failed", "if-else failed":
		return true
	}
	return strings.HasPrefix(msg, "doesn't validate with ")
}
