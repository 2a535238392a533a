// Package tooldesc scans what an agent reads of a tool besides its results:
// the manifest's description and name, the texts of its input and output
// schemas (description, title, default, examples, enum and const strings),
// its worked examples and, for an imported tool, what the server said about
// it. A tool's description is read by the model as trusted context, so it is
// where tool poisoning hides ("<IMPORTANT>ignore previous instructions…").
// The detectors are the output guard's (internal/detect). The package also
// computes the digest an imported tool is pinned to.
package tooldesc

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/detect"
)

// Modes: what an import does with instructions found in a tool's texts.
const (
	// Refuse: the tool is not registered (E3865). The default: a
	// description that addresses the agent has no business in a tool.
	Refuse = "refuse"
	// Sanitise: each string holding a finding is replaced by Marker.
	Sanitise = "sanitise"
	// Flag: kept, recorded in the manifest, shown with a warning by the
	// MCP front end.
	Flag = "flag"
)

// Modes lists the modes, the default first.
var Modes = []string{Refuse, Sanitise, Flag}

// Actions a Finding records.
const (
	ActionSanitised = "sanitised"
	ActionRedacted  = "redacted"
	ActionFlagged   = "flagged"
)

// Guarded are the detectors whose findings the mode governs: text aimed at
// the agent, and code handed to it to run. Secrets are always redacted;
// personal data and SQL or shell text are what many honest descriptions
// show as examples, so they are not scanned here.
var Guarded = []detect.Detector{detect.PromptInjection, detect.MaliciousCode}

var scanned = append([]detect.Detector{detect.Secrets}, Guarded...)

// Finding is one detector's match in one string of a manifest.
type Finding struct {
	// Path is the JSON pointer of the string in the manifest.
	Path     string `json:"path"`
	Detector string `json:"detector"`
	Rule     string `json:"rule"`
	// Action is what the import did: sanitised, redacted or flagged;
	// empty for a finding nothing was done about.
	Action string `json:"action"`
}

// Marker is what a sanitised string becomes.
func Marker(rule string) string {
	return "[removed by toolgate: text addressed to the agent (" + rule + ")]"
}

// CheckMode refuses an unknown mode.
func CheckMode(mode string) error {
	if !slices.Contains(Modes, mode) {
		return fmt.Errorf("description mode %q: want one of %s", mode, strings.Join(Modes, ", "))
	}
	return nil
}

// Apply scans manifest doc and returns it with every secret redacted and,
// by mode, each string holding a guarded finding replaced by Marker
// (Sanitise) or kept (Flag, Refuse). Each finding is returned with its
// action; under Refuse, guarded findings have none: the caller refuses.
// doc is returned as it was when nothing was changed.
func Apply(e *detect.Engine, doc []byte, mode string) ([]byte, []Finding, error) {
	if err := CheckMode(mode); err != nil {
		return nil, nil, err
	}
	m, err := decode(doc)
	if err != nil {
		return nil, nil, err
	}
	var out []Finding
	changed := false
	walkManifest(m, func(path, s string) (string, bool) {
		fs := e.Scan(s, scanned...)
		if len(fs) == 0 {
			return s, false
		}
		var secrets, guarded []detect.Finding
		for _, f := range fs {
			if f.Detector == detect.Secrets {
				secrets = append(secrets, f)
			} else {
				guarded = append(guarded, f)
			}
		}
		repl := s
		for _, f := range oneEach(secrets) {
			out = append(out, Finding{Path: path, Detector: string(f.Detector), Rule: f.Rule, Action: ActionRedacted})
		}
		if len(secrets) > 0 {
			repl = redact(e, s)
		}
		action := map[string]string{Sanitise: ActionSanitised, Flag: ActionFlagged}[mode]
		for _, f := range oneEach(guarded) {
			out = append(out, Finding{Path: path, Detector: string(f.Detector), Rule: f.Rule, Action: action})
		}
		if len(guarded) > 0 && mode == Sanitise {
			repl = Marker(guarded[0].Rule)
		}
		if repl != s {
			changed = true
			return repl, true
		}
		return s, false
	})
	sortFindings(out)
	if !changed {
		return doc, out, nil
	}
	b, err := json.Marshal(m)
	return b, out, err
}

// Refusal is the error refusing a tool whose texts hold unhandled
// findings: E3866 when one is a secret, else E3865; it names each field
// path and detector.
func Refusal(id string, fs []Finding) error {
	if len(fs) == 0 {
		return nil
	}
	ecode, what := api.EToolDescriptionRefused, "instructions or code aimed at the agent"
	var where []string
	var list []map[string]string
	for _, f := range fs {
		if f.Detector == string(detect.Secrets) {
			ecode, what = api.EToolDescriptionSecret, "a secret"
		}
		where = append(where, f.Path+" ("+f.Detector+")")
		list = append(list, map[string]string{"path": f.Path, "detector": f.Detector, "rule": f.Rule})
	}
	err := api.NewError(api.InvalidParameters, ecode,
		"tool %s: its texts hold %s, which agents would read as part of their instructions: %s",
		id, what, strings.Join(where, ", "))
	err.Details = map[string]any{"tool_id": id, "findings": list}
	return err
}

// Check scans manifest doc as the registry receives it and returns the
// findings it may not hold: every secret, and every guarded finding that
// the manifest's own record (<kind>.description_findings) does not list as
// flagged at its path. A manifest an import sanitised has none left.
func Check(e *detect.Engine, doc []byte) ([]Finding, error) {
	m, err := decode(doc)
	if err != nil {
		return nil, err
	}
	flagged := map[string]bool{}
	for _, f := range Recorded(doc) {
		if f.Action == ActionFlagged {
			flagged[f.Path+"\x00"+f.Detector] = true
		}
	}
	var bad []Finding
	walkManifest(m, func(path, s string) (string, bool) {
		for _, f := range oneEach(e.Scan(s, scanned...)) {
			if f.Detector != detect.Secrets && flagged[path+"\x00"+string(f.Detector)] {
				continue
			}
			bad = append(bad, Finding{Path: path, Detector: string(f.Detector), Rule: f.Rule})
		}
		return s, false
	})
	sortFindings(bad)
	return bad, nil
}

// sortFindings orders fs by path and detector: maps are walked in no order.
func sortFindings(fs []Finding) {
	slices.SortFunc(fs, func(a, b Finding) int {
		return cmp.Or(strings.Compare(a.Path, b.Path), strings.Compare(a.Detector, b.Detector))
	})
}

// kindSpec is what this package reads of a manifest's kind configuration.
type kindSpec struct {
	Digest   string    `json:"description_digest"`
	Findings []Finding `json:"description_findings"`
}

func specOf(doc []byte) kindSpec {
	var m map[string]json.RawMessage
	var kind string
	var s kindSpec
	if json.Unmarshal(doc, &m) != nil || json.Unmarshal(m["kind"], &kind) != nil || kind == "" {
		return s
	}
	_ = json.Unmarshal(m[kind], &s)
	return s
}

// Flagged are the findings a kind's configuration spec (tools.Manifest's
// Spec) records as flagged: kept in the texts agents read.
func Flagged(spec json.RawMessage) []Finding {
	var s kindSpec
	_ = json.Unmarshal(spec, &s)
	var out []Finding
	for _, f := range s.Findings {
		if f.Action == ActionFlagged {
			out = append(out, f)
		}
	}
	return out
}

// PinnedIn is the digest a kind's configuration spec was imported with.
func PinnedIn(spec json.RawMessage) string {
	var s kindSpec
	_ = json.Unmarshal(spec, &s)
	return s.Digest
}

// Recorded is what manifest doc records of its import's scan.
func Recorded(doc []byte) []Finding { return specOf(doc).Findings }

// Pinned is the digest manifest doc was imported with, or "".
func Pinned(doc []byte) string { return specOf(doc).Digest }

// Digest is sha256:<hex> of v's canonical JSON: members sorted by name,
// no insignificant space, numbers as written.
func Digest(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var tree any
	if err := d.Decode(&tree); err != nil {
		return "", err
	}
	// encoding/json writes map members sorted by name.
	if b, err = json.Marshal(tree); err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

func decode(doc []byte) (map[string]any, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, api.WrapError(err, api.InvalidParameters, api.EInvalidManifest, "the manifest does not decode: %v", err)
	}
	return m, nil
}

// redact replaces the secrets in s, by the output guard's own redaction.
func redact(e *detect.Engine, s string) string {
	b, _ := json.Marshal(s)
	if r, _, err := e.RedactJSON(b, detect.Secrets); err == nil {
		var out string
		if json.Unmarshal(r, &out) == nil {
			return out
		}
	}
	return detect.Redacted(detect.RuleNamedValue)
}

// oneEach keeps the first finding of each detector: a string is handled
// whole, so more of the same detector say nothing new.
func oneEach(fs []detect.Finding) []detect.Finding {
	var out []detect.Finding
	for _, f := range fs {
		if !slices.ContainsFunc(out, func(o detect.Finding) bool { return o.Detector == f.Detector }) {
			out = append(out, f)
		}
	}
	return out
}

// visit sees one string at its JSON pointer and returns its replacement.
type visit func(path, s string) (string, bool)

// walkManifest visits the strings of m an agent reads: name, description,
// the schemas' texts, the worked examples and the kind's record of what
// the server said (server_annotations).
func walkManifest(m map[string]any, fn visit) {
	for _, k := range []string{"name", "description"} {
		if s, ok := m[k].(string); ok {
			if r, ok := fn("/"+k, s); ok {
				m[k] = r
			}
		}
	}
	for _, k := range []string{"input_schema", "output_schema"} {
		m[k] = walkSchema(m[k], "/"+k, fn)
	}
	if ex, ok := m["examples"]; ok {
		m["examples"] = walkAll(ex, "/examples", fn)
	}
	if kind, _ := m["kind"].(string); kind != "" {
		if spec, ok := m[kind].(map[string]any); ok {
			if a, ok := spec["server_annotations"]; ok {
				spec["server_annotations"] = walkAll(a, "/"+kind+"/server_annotations", fn)
			}
		}
	}
}

// schemaTexts are the keywords of a JSON Schema whose values are text or
// instances a model reads.
var schemaTexts = map[string]bool{"description": true, "title": true, "default": true, "examples": true, "enum": true, "const": true}

// schemaMaps are the keywords whose values map names to schemas: a
// property named "description" is a schema, not a text.
var schemaMaps = map[string]bool{"properties": true, "patternProperties": true, "$defs": true, "definitions": true, "dependentSchemas": true}

// walkSchema visits the texts of schema v and of every schema within it.
func walkSchema(v any, path string, fn visit) any {
	switch t := v.(type) {
	case map[string]any:
		for k, c := range t {
			p := path + "/" + pointerToken(k)
			if schemaMaps[k] {
				if named, ok := c.(map[string]any); ok {
					for n, s := range named {
						named[n] = walkSchema(s, p+"/"+pointerToken(n), fn)
					}
					continue
				}
			}
			if schemaTexts[k] {
				t[k] = walkAll(c, p, fn)
			} else {
				t[k] = walkSchema(c, p, fn)
			}
		}
	case []any:
		for i, c := range t {
			t[i] = walkSchema(c, fmt.Sprintf("%s/%d", path, i), fn)
		}
	}
	return v
}

// walkAll visits every string within v.
func walkAll(v any, path string, fn visit) any {
	switch t := v.(type) {
	case string:
		if r, ok := fn(path, t); ok {
			return r
		}
	case map[string]any:
		for k, c := range t {
			t[k] = walkAll(c, path+"/"+pointerToken(k), fn)
		}
	case []any:
		for i, c := range t {
			t[i] = walkAll(c, fmt.Sprintf("%s/%d", path, i), fn)
		}
	}
	return v
}

func pointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
