package clitool

import (
	"encoding/json"
	"fmt"

	"github.com/toolgate/toolgate/internal/tools"
)

// Config is the cli member of a manifest: a command-line tool, run in the
// sandbox.
type Config struct {
	Command []string          `json:"command"`
	Stdin   string            `json:"stdin,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Network bool              `json:"network,omitempty"`
	// Operands name the parameters that are operands of the command (a
	// repository, a file name), never options: a value beginning with "-"
	// is refused before the command runs (sandbox.Expand).
	Operands []string `json:"operands,omitempty"`
}

// Decode decodes the manifest's cli configuration.
func Decode(m *tools.Manifest) (*Config, error) {
	if len(m.Spec()) == 0 {
		return nil, fmt.Errorf("%s has no cli configuration", m.Key())
	}
	var c Config
	if err := json.Unmarshal(m.Spec(), &c); err != nil {
		return nil, fmt.Errorf("%s cli configuration: %w", m.Key(), err)
	}
	return &c, nil
}
