package tools

import (
	"embed"
	"fmt"
	"path"
)

// exampleFS holds the manifests of the builtin example tools, one file per
// tool version.
//
//go:embed examples/*.json
var exampleFS embed.FS

// Examples parses the example manifests shipped in the binary, in file name
// order. They describe the builtin tools every deployment has, and http.get,
// which reaches only the hosts a capability token grants.
func Examples() ([]*Manifest, error) {
	files, err := exampleFS.ReadDir("examples")
	if err != nil {
		return nil, err
	}
	ms := make([]*Manifest, 0, len(files))
	for _, f := range files {
		doc, err := exampleFS.ReadFile(path.Join("examples", f.Name()))
		if err != nil {
			return nil, err
		}
		m, err := Parse(doc)
		if err != nil {
			return nil, fmt.Errorf("example %s: %w", f.Name(), err)
		}
		ms = append(ms, m)
	}
	return ms, nil
}
