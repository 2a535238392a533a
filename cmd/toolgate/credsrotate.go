package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/busauth"
)

// credsRotateCmd issues a local serve's role credentials anew: serve keeps
// them across restarts (so an exported NATS_TOKEN stays good), and changes
// them only when asked.
func (a *app) credsRotateCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rotate",
		Short: "Issue a local serve's credentials files (operator, control, each stage) anew",
		Long: `Issue the credentials files serve keeps in <data>/busauth (operator.creds,
control.creds, one per stage, with their .jwt and .nk halves) anew. serve
keeps them across restarts of the same data directory, so that what was
exported from them (NATS_NKEY, NATS_TOKEN) keeps working; rotate when they
may have leaked, then export them again. A running serve reconnects with the
new ones by itself. The earlier files are still admitted until the
deployment's credential signer changes: rotating replaces what the data
directory hands out, it revokes nothing (docs/security.md).`,
		Example: `  toolgate creds rotate --data toolgate-data
  export NATS_NKEY=toolgate-data/busauth/operator.nk NATS_TOKEN="$(cat toolgate-data/busauth/operator.jwt)"`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := filepath.Join(a.data, busauth.DirName)
			if _, err := busauth.LoadKeys(a.data); err != nil {
				return fmt.Errorf("creds rotate: the deployment's keys (%s): %w", dir, err)
			}
			if _, err := busauth.RotateCredentials(a.data); err != nil {
				return fmt.Errorf("creds rotate: %w", err)
			}
			if a.json {
				return a.printJSON(map[string]any{"rotated": dir})
			}
			fmt.Fprintf(a.stdout, "new credentials files in %s; export them again:\n  export NATS_NKEY=%s NATS_TOKEN=\"$(cat %s)\"\n",
				dir, filepath.Join(dir, "operator.nk"), filepath.Join(dir, "operator.jwt"))
			return nil
		},
	}
}
