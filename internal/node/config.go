package node

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/toolgate/toolgate/archivestore"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/topology"
	"github.com/toolgate/toolgate/subjects"
)

// DefaultAuditCheck is Config.AuditCheck's default.
const DefaultAuditCheck = 10 * time.Second

// DefaultApprovalSweep is Config.ApprovalSweep's default.
const DefaultApprovalSweep = time.Second

// DefaultTokenIssuer is Config.TokenIssuer's and TokenAudience's default.
const DefaultTokenIssuer = "toolgate"

// errEmbeddedDataDir: the embedded server keeps its store and the bus
// credentials it issues in the data directory.
var errEmbeddedDataDir = errors.New("embedded NATS needs a data directory for its store and credentials")

// withDefaults fills what c leaves zero, in one place, so the phases of
// Run read settled values. Run applies it after resolvePaths, whose check
// of the file root must see the development key directory as given.
func (c Config) withDefaults() Config {
	if c.Log == nil {
		c.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if len(c.Stages) == 0 && c.Site != "" {
		c.Stages = []string{subjects.Execute}
	}
	if len(c.Stages) == 0 {
		c.Stages = append(append([]string{}, subjects.Stages...), Control)
	}
	if c.Site != "" {
		c.Topology.Site = c.Site
	}
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.InFlight = cmp.Or(c.InFlight, DefaultInFlight)
	c.DevKeyDir = cmp.Or(c.DevKeyDir, c.Embedded.DataDir)
	c.TokenIssuer = cmp.Or(c.TokenIssuer, DefaultTokenIssuer)
	c.TokenAudience = cmp.Or(c.TokenAudience, DefaultTokenIssuer)
	c.AuditCheck = cmp.Or(c.AuditCheck, DefaultAuditCheck)
	c.ApprovalSweep = cmp.Or(c.ApprovalSweep, DefaultApprovalSweep)
	return c
}

// Validate refuses the combinations Run cannot start with, before it
// starts anything. It judges c as Run would, with its defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Site != "" {
		if err := subjects.CheckSite(c.Site); err != nil {
			return fmt.Errorf("--site: %w", err)
		}
		if c.Hub == "" || c.Creds == "" || c.NATSURL != "" {
			return errors.New("a site runs with --hub (the hub's leaf-node URL) and --creds (its credentials from toolgate site add), without --nats")
		}
		if len(c.Stages) != 1 || c.Stages[0] != subjects.Execute {
			return errors.New("a site runs execute alone")
		}
	}
	if c.NATSURL == "" && c.Embedded.DataDir == "" {
		return errEmbeddedDataDir
	}
	if c.NATSURL != "" && c.Creds != "" {
		own := slices.DeleteFunc(slices.Clone(c.Stages), func(s string) bool { return s == AuthCallout })
		// The callout alone runs with the control service's role.
		if !(len(own) == 0 && c.AuthCallout) && len(own) != 1 {
			return fmt.Errorf("--creds names one role's credentials: run one stage with it, or give each stage its own <stage>.creds in %s",
				filepath.Join(c.Embedded.DataDir, busauth.DirName))
		}
	}
	if c.Examples && c.JWKSPath == "" && c.Stage.Tokens == nil && c.DevKeyDir == "" {
		return errors.New("examples: no directory for the development key (set DevKeyDir or the data directory)")
	}
	// What ages out of AUDIT must have been archived: a run, and its
	// retries, must fit well inside the age limit.
	maxAge := cmp.Or(c.Topology.AuditMaxAge, topology.DefaultAuditMaxAge)
	if every := c.Stage.AuditArchiveEvery; every > 0 && maxAge > 0 && every > maxAge/4 {
		return fmt.Errorf("--archive-every %s is not well under AUDIT's age limit %s: at most a quarter of it, so nothing ages out unarchived", every, maxAge)
	}
	if _, err := archivestore.ParseLocation(c.Stage.AuditArchive, subjects.BucketAuditArchive); err != nil {
		return fmt.Errorf("--archive: %w", err)
	}
	return nil
}
