package node

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// nodeSet are a process's connections: one per stage it runs, each with
// its stage's role; the control service's; and the operator's, when the
// process holds operator credentials. On a bus without authentication one
// connection serves them all.
type nodeSet struct {
	stage   map[string]*Node
	control *Node
	op      *Node
}

// all returns each connection once.
func (s *nodeSet) all() []*Node {
	var out []*Node
	add := func(n *Node) {
		if n != nil && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	add(s.op)
	for _, name := range subjects.Stages {
		add(s.stage[name])
	}
	add(s.control)
	return out
}

// first returns prefer if set, else the first stage's connection in
// pipeline order, else the control service's.
func (s *nodeSet) first(prefer *Node) *Node {
	if prefer != nil {
		return prefer
	}
	for _, name := range subjects.Stages {
		if n := s.stage[name]; n != nil {
			return n
		}
	}
	if s.control != nil {
		return s.control
	}
	return s.op
}

// openNodes connects what c runs. With operator credentials the topology
// is set up first, as the operator; every role then binds to it.
func openNodes(ctx context.Context, url string, c *Config, authenticated bool, opCreds string,
	roleOpts func(busauth.Role) []nats.Option, base []nats.Option, gate bool, log *slog.Logger) (*nodeSet, *Node, error) {
	set := &nodeSet{stage: map[string]*Node{}}
	needCtl := slices.Contains(c.Stages, Control) || c.Examples || gate
	if !authenticated {
		n, err := Open(ctx, url, "toolgate", c.Topology, log, base...)
		if err != nil {
			return nil, nil, err
		}
		for _, name := range c.Stages {
			if slices.Contains(subjects.Stages, name) {
				set.stage[name] = n
			}
		}
		set.control, set.op = n, n
		return set, n, nil
	}
	fail := func(err error) (*nodeSet, *Node, error) {
		for _, n := range set.all() {
			n.Close()
		}
		return nil, nil, err
	}
	if opCreds != "" {
		n, err := openRole(ctx, url, "toolgate-operator", "", c.Topology, nil, log, c.Stage.StateProof, append(slices.Clone(base), busauth.CredentialsOption(opCreds))...)
		if err != nil {
			return fail(fmt.Errorf("operator connection (topology setup): %w", err))
		}
		n.Role = busauth.RoleOperator
		set.op = n
	}
	// The stages' stores remember their writes together, as they did on
	// one connection (kvstore.Memory).
	mem := kvstore.NewMemory()
	open := func(r busauth.Role) (*Node, error) {
		opts := roleOpts(r)
		if len(opts) == len(base) {
			return nil, fmt.Errorf("no credentials for role %s: give --creds, or put %s in %s", r,
				busauth.CredsFile(r), filepath.Join(c.Embedded.DataDir, busauth.DirName))
		}
		n, err := openRole(ctx, url, "toolgate-"+string(r), r, c.Topology, mem, log, c.Stage.StateProof, opts...)
		if err != nil {
			return nil, fmt.Errorf("%s connection: %w", r, err)
		}
		return n, nil
	}
	for _, name := range c.Stages {
		r, ok := busauth.StageRole(name)
		if !ok {
			continue
		}
		n, err := open(r)
		if err != nil {
			return fail(err)
		}
		set.stage[name] = n
	}
	if needCtl {
		n, err := open(busauth.RoleControl)
		if err != nil {
			return fail(err)
		}
		set.control = n
	}
	return set, set.op, nil
}
