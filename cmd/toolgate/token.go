package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/node"
	"github.com/toolgate/toolgate/internal/token"
)

func (a *app) tokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Capability tokens: keygen, mint, inspect, revoke",
		Args:  subcommand,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.tokenKeygenCmd(), a.tokenMintCmd(), a.tokenInspectCmd(), a.tokenRevokeCmd())
	return cmd
}

type keygenOptions struct {
	alg, out, jwks string
	force          bool
}

// keygen writes a new signing key and its public key set. An existing key
// or key set is kept unless force is set: a new key invalidates every token
// the old one signed.
func keygen(o keygenOptions) (*token.SigningKey, error) {
	if !o.force {
		for _, p := range []string{o.out, o.jwks} {
			if _, err := os.Lstat(p); err == nil {
				return nil, fmt.Errorf("token keygen: %s exists; replacing the key invalidates every token it signed (use --force)", p)
			} else if !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("token keygen: %w", err)
			}
		}
	}
	k, err := token.GenerateSigningKey(o.alg)
	if err != nil {
		return nil, err
	}
	priv, err := k.MarshalPrivate()
	if err != nil {
		return nil, err
	}
	pub, err := k.PublicJWKS()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(o.out, priv, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(o.jwks, pub, 0o644); err != nil {
		return nil, err
	}
	return k, nil
}

func (a *app) tokenKeygenCmd() *cobra.Command {
	var o keygenOptions
	cmd := &cobra.Command{
		Use:   "keygen",
		Short: "Create a signing key and the public key set serve --jwks reads",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			k, err := keygen(o)
			if err != nil {
				return err
			}
			return a.emit(map[string]string{"kid": k.KID, "alg": k.Alg, "key": o.out, "jwks": o.jwks}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "key %s (%s): private key in %s, public key set in %s\n", k.KID, k.Alg, o.out, o.jwks)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&o.alg, "alg", token.AlgEdDSA, "EdDSA or RS256")
	cmd.Flags().StringVar(&o.out, "out", "signing-key.jwk", "private key file to write (mode 0600)")
	cmd.Flags().StringVar(&o.jwks, "jwks", "jwks.json", "public key set to write, for serve --jwks")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace an existing key and key set (every token signed with the old key stops verifying)")
	return cmd
}

func (a *app) tokenMintCmd() *cobra.Command {
	var keyPath, parent, issuer, audience, tenant, agent, session, version, mode string
	var ttl, maxLife time.Duration
	var tenantReader bool
	var tools, paths, hosts, secrets, exclude, preApprove, ops []string
	var ports []int
	var b token.Budget
	cmd := &cobra.Command{
		Use:   "mint",
		Short: "Sign a capability token (or a narrower child of --parent)",
		Example: `  toolgate token mint --key signing-key.jwk --tenant acme --agent did:agent:a --tools 'fs.*' --paths /reports --ttl 1h
  toolgate token mint --key signing-key.jwk --parent "$TOKEN" --tools fs.read_file --ttl 10m`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			k, err := token.LoadSigningKey(keyPath)
			if err != nil {
				return err
			}
			c := token.Claims{
				ToolID: token.Patterns(tools), ToolVersion: version, TenantID: tenant, AgentDID: agent, SessionID: session,
				AllowedOperations: ops, ExcludedSideEffects: exclude, PreApproved: token.Patterns(preApprove),
				TenantReader:     tenantReader,
				RegisteredClaims: jwt.RegisteredClaims{ExpiresAt: jwt.NewNumericDate(time.Now().Add(ttl))},
			}
			if len(paths) > 0 || mode != "" {
				c.Filesystem = &token.FilesystemGrant{AllowedPaths: paths, Mode: mode}
			}
			if len(hosts) > 0 || len(ports) > 0 {
				c.Network = &token.NetworkGrant{AllowedHosts: hosts, AllowedPorts: ports}
			}
			if len(secrets) > 0 {
				c.Credentials = &token.CredentialGrant{AllowedSecrets: secrets}
			}
			if b != (token.Budget{}) {
				c.Budget = &b
			}
			if parent != "" {
				// The parent must verify under this key: only its issuer narrows it.
				pc, err := parseUnverified(parent)
				if err != nil {
					return err
				}
				v := &token.Verifier{Keys: token.StaticKeys{Set: k.KeySet()}, Issuer: pc.Issuer, Audience: first(pc.Audience)}
				verified, err := v.Verify(parent)
				if err != nil {
					return fmt.Errorf("parent token: %w", err)
				}
				if !cmd.Flags().Changed("ttl") {
					c.ExpiresAt = nil // inherit the parent's expiry
				}
				if c, err = token.Attenuate(verified, c); err != nil {
					return err
				}
			} else {
				c.Issuer, c.Audience, c.Subject = issuer, jwt.ClaimStrings{audience}, agent
				if len(c.AllowedOperations) == 0 {
					c.AllowedOperations = []string{token.OperationExecute}
				}
			}
			raw, err := token.MintWithin(k, c, maxLife)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(a.stdout, raw)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&keyPath, "key", "", "private signing key (JWK), from token keygen (required)")
	f.StringVar(&parent, "parent", "", "derive from this token, narrowing it; fields not given are inherited")
	f.StringVar(&issuer, "issuer", "toolgate", "iss")
	f.StringVar(&audience, "audience", "toolgate", "aud")
	f.StringVar(&tenant, "tenant", "", "tenant id the token is for")
	f.StringVar(&agent, "agent", "", "agent DID")
	f.StringVar(&session, "session", "", "bind to this session")
	f.BoolVar(&tenantReader, "tenant-reader", false, "let the holder see every call of its tenant, not only its own agent's (docs/security.md)")
	f.StringVar(&version, "version", "", "semver range of granted versions")
	f.DurationVar(&ttl, "ttl", time.Hour, "lifetime")
	f.DurationVar(&maxLife, "max-lifetime", token.DefaultMaxLifetime, "longest lifetime the verifiers accept (serve --token-max-lifetime)")
	f.StringVar(&mode, "mode", "", "filesystem mode: ro or rw")
	f.StringSliceVar(&tools, "tools", nil, "granted tool ids or patterns (fs.*)")
	f.StringSliceVar(&paths, "paths", nil, "granted paths under the file root")
	f.StringSliceVar(&hosts, "hosts", nil, "granted hosts (api.example.com, *.example.com)")
	f.IntSliceVar(&ports, "ports", nil, "granted ports")
	f.StringSliceVar(&secrets, "secrets", nil, "granted credentials by name")
	f.StringSliceVar(&exclude, "exclude", nil, "excluded side effects (network, fs.write, ...)")
	f.StringSliceVar(&preApprove, "pre-approve", nil, "tools whose high-risk calls need no approval")
	f.StringSliceVar(&ops, "operations", nil, "allowed operations (default: execute)")
	f.Int64Var(&b.MaxCalls, "max-calls", 0, "session budget: calls")
	f.Int64Var(&b.MaxRuntimeMS, "max-runtime-ms", 0, "session budget: tool runtime")
	f.Float64Var(&b.MaxCost, "max-cost", 0, "session budget: cost")
	f.Int64Var(&b.MaxTokens, "max-tokens", 0, "session budget: model tokens")
	f.Int64Var(&b.ApprovalAfterFailures, "approval-after-failures", 0, "require approval after this many failures in a row")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// parseUnverified decodes a token's claims without checking its signature,
// for display and to find what to verify it against.
func parseUnverified(raw string) (*token.Claims, error) {
	var c token.Claims
	if _, _, err := jwt.NewParser().ParseUnverified(strings.TrimSpace(raw), &c); err != nil {
		return nil, fmt.Errorf("not a JWT: %w", err)
	}
	return &c, nil
}

func (a *app) tokenInspectCmd() *cobra.Command {
	var jwks, issuer, audience string
	cmd := &cobra.Command{
		Use:   "inspect TOKEN",
		Short: "Show a token's claims; with --jwks verify it too (exit 4 when it does not verify)",
		Args:  exactArgs(1, "a token"),
		RunE: func(_ *cobra.Command, args []string) error {
			raw := strings.TrimSpace(args[0])
			t, _, err := jwt.NewParser().ParseUnverified(raw, &token.Claims{})
			if err != nil {
				return fmt.Errorf("not a JWT: %w", err)
			}
			out := map[string]any{"header": t.Header, "claims": t.Claims, "verified": false}
			c := t.Claims.(*token.Claims)
			inbox := ""
			if c.TenantID != "" && c.ID != "" {
				// What an agent's NATS client must set (nats --inbox-prefix).
				inbox = busauth.InboxPrefix(c.TenantID, c.ID)
				out["inbox_prefix"] = inbox
			}
			var verr error
			if jwks != "" {
				ks, err := token.LoadKeySet(jwks)
				if err != nil {
					return err
				}
				v := &token.Verifier{Keys: token.StaticKeys{Set: ks}, Issuer: issuer, Audience: audience}
				if _, verr = v.Verify(raw); verr != nil {
					out["error"] = verr.Error()
				} else {
					out["verified"] = true
				}
			}
			err = a.emit(out, func(w io.Writer) error {
				rows := [][]string{
					{"tenant", c.TenantID}, {"agent", c.AgentDID}, {"subject", c.Subject}, {"token id", c.ID}, {"inbox prefix", inbox},
					{"issuer", c.Issuer}, {"audience", strings.Join(c.Audience, ",")},
					{"tools", strings.Join(patterns(c.ToolID), ",")}, {"operations", strings.Join(c.AllowedOperations, ",")},
				}
				rows = append(rows, grantRows(c)...)
				if c.TenantReader {
					rows = append(rows, []string{"sees", "every call of the tenant (tenant_reader)"})
				}
				if c.ExpiresAt != nil {
					rows = append(rows, []string{"expires", c.ExpiresAt.UTC().Format(time.RFC3339)})
				}
				if c.SessionID != "" {
					rows = append(rows, []string{"session", c.SessionID})
				}
				if len(c.Chain) > 0 {
					rows = append(rows, []string{"chain", strings.Join(c.Chain, ",")})
				}
				tw := [][]string{}
				for _, r := range rows {
					if r[1] != "" {
						tw = append(tw, []string{r[0] + ":", r[1]})
					}
				}
				if err := table(w, []string{"alg:", fmt.Sprint(t.Header["alg"]) + "  kid " + fmt.Sprint(t.Header["kid"])}, tw); err != nil {
					return err
				}
				switch {
				case jwks == "":
					fmt.Fprintln(w, "not verified (give --jwks to verify)")
				case verr != nil:
					fmt.Fprintln(w, "does NOT verify:", verr)
				default:
					fmt.Fprintln(w, "verified against", jwks)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if verr != nil {
				return &codeError{code: exitDenied, err: verr, shown: !a.json}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jwks, "jwks", "", "verify against this key set too")
	cmd.Flags().StringVar(&issuer, "issuer", "toolgate", "expected iss when verifying")
	cmd.Flags().StringVar(&audience, "audience", "toolgate", "expected aud when verifying")
	return cmd
}

func patterns(p token.Patterns) []string { return slices.Clone([]string(p)) }

func (a *app) tokenRevokeCmd() *cobra.Command {
	var jti, reason string
	var maxLife time.Duration
	cmd := &cobra.Command{
		Use:   "revoke (TOKEN | --jti ID)",
		Short: "Revoke a token and every token derived from it",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// A revocation lasts as long as the token could still verify:
			// its expiry plus the verifiers' leeway, at most the longest
			// lifetime.
			var claims *token.Claims
			id := jti
			if len(args) == 1 {
				c, err := parseUnverified(args[0])
				if err != nil {
					return err
				}
				id, claims = c.ID, c
			}
			until := token.RevokeUntil(claims, time.Now(), maxLife, node.TokenLeeway)
			if id == "" {
				return usageErr("token revoke: give a token or --jti")
			}
			c, done, err := a.adminClient()
			if err != nil {
				return err
			}
			defer done()
			if _, err := c.RevokeToken(cmd.Context(), id, until, reason, whoami()); err != nil {
				return err
			}
			return a.emit(map[string]any{"jti": id, "until": until.UTC()}, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "revoked %s (and every token derived from it) until %s\n", id, until.UTC().Format(time.RFC3339))
				return err
			})
		},
	}
	cmd.Flags().StringVar(&jti, "jti", "", "token id to revoke (instead of a token)")
	cmd.Flags().StringVar(&reason, "reason", "", "why")
	cmd.Flags().DurationVar(&maxLife, "max-lifetime", token.DefaultMaxLifetime, "longest token lifetime the verifiers accept (serve --token-max-lifetime)")
	return cmd
}

// grantRows are the token's grants beyond tools and operations, as inspect
// shows them: what a call may touch, and what it needs no approval for.
func grantRows(c *token.Claims) [][]string {
	var rows [][]string
	if f := c.Filesystem; f != nil {
		mode := "read-only"
		if f.Mode == "rw" {
			mode = "read-write"
		}
		rows = append(rows, []string{"files", mode + " under " + strings.Join(f.AllowedPaths, ",")})
	} else {
		rows = append(rows, []string{"files", "none"})
	}
	if n := c.Network; n != nil {
		hosts := strings.Join(n.AllowedHosts, ",")
		if len(n.AllowedPorts) > 0 {
			hosts += " ports " + strings.Trim(fmt.Sprint(n.AllowedPorts), "[]")
		}
		rows = append(rows, []string{"hosts", hosts})
	}
	if cr := c.Credentials; cr != nil {
		rows = append(rows, []string{"secrets", strings.Join(cr.AllowedSecrets, ",")})
	}
	rows = append(rows, []string{"excluded", strings.Join(c.ExcludedSideEffects, ",")},
		[]string{"pre-approved", strings.Join(patterns(c.PreApproved), ",")})
	return rows
}
