package node

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/sandbox"
	"github.com/toolgate/toolgate/internal/token"
	"github.com/toolgate/toolgate/subjects"
)

// securitySettings are the settings that decide what a call may do, by the
// stage that applies them. Workers of one stage share its calls, so they
// must agree: a worker without the key set would refuse a share of the
// calls, one with --sandbox none would run a share of cli tools unconfined.
func securitySettings(c *Config) (map[string]map[string]string, error) {
	out := map[string]map[string]string{}
	if slices.Contains(c.Stages, subjects.Authorize) {
		keys := "none"
		switch {
		case c.JWKSPath != "":
			ks, err := token.LoadKeySet(c.JWKSPath)
			if err != nil {
				return nil, err
			}
			keys = ks.Fingerprint()
		case c.Stage.Tokens != nil && c.Stage.Tokens.Keys != nil && c.Stage.Tokens.Keys.KeySet() != nil:
			keys = c.Stage.Tokens.Keys.KeySet().Fingerprint()
		}
		iss, aud := "", ""
		if c.Stage.Tokens != nil {
			iss, aud = c.Stage.Tokens.Issuer, c.Stage.Tokens.Audience
		}
		out["authorize"] = map[string]string{"key set": keys, "token issuer": iss, "token audience": aud}
	}
	if slices.Contains(c.Stages, subjects.Execute) {
		mode := c.Stage.Sandbox.Mode
		if mode == "" {
			mode = sandbox.ModeBwrap
		}
		root := c.Stage.Sandbox.FileRoot
		if root == "" {
			root = c.Stage.BuiltinEnv.FileRoot
		}
		out["execute"] = map[string]string{"sandbox": mode, "file root": root,
			"http private networks": strconv.FormatBool(c.Stage.HTTPAllowPrivateNetworks)}
	}
	return out, nil
}

// checkSecurity records this worker's security settings on the cluster's
// first start and refuses to start a worker whose settings differ, naming
// the setting. With reset, this worker's settings replace the record.
func checkSecurity(ctx context.Context, c *Config, stages map[string]*Node, reset bool, log *slog.Logger) error {
	groups, err := securitySettings(c)
	if err != nil {
		return err
	}
	for _, group := range slices.Sorted(maps.Keys(groups)) {
		want := groups[group]
		n := stages[group] // each group is a stage's, recorded by that stage's role
		if n == nil {
			continue
		}
		key := group
		if group == subjects.Execute && c.Site != "" {
			// A site's sandbox and file root are its own: its workers
			// agree with each other, not with the hub's.
			key = group + ".site." + c.Site
		}
		got, err := n.Store.RecordSettings(ctx, key, want, reset)
		if err != nil {
			return err
		}
		if reset {
			log.Warn("security settings replaced: workers started with the old ones keep them until restarted",
				"stage", group, "settings", want)
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(want)) {
			if got[k] != want[k] {
				return api.NewError(api.StateConflict, api.ESecuritySettings,
					"this worker's %s setting %q is %q, but the cluster runs with %q: every %s worker must use the same one "+
						"(to change it deliberately, start with --reset-security-settings)", group, k, want[k], got[k], group).
					WithDetail("setting", k).WithDetail("stage", group)
			}
		}
	}
	return nil
}
