package tools

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/agnivade/levenshtein"
	"github.com/toolgate/toolgate/api"
)

// Registry holds tool manifests by id and version. It is safe for concurrent
// use, and its zero value is an empty registry.
//
// Reads vastly outnumber writes (every invocation resolves its tool a few
// times; manifests change rarely), so Put keeps each tool's versions sorted
// and Resolve only binary-searches or scans down from the highest.
type Registry struct {
	mu    sync.RWMutex
	tools map[string][]entry // versions of each tool, ascending

	// parsed caches parsed constraints: parsing a range costs microseconds
	// and the same few constraints come back on every invocation.
	parsed  sync.Map // string → *semver.Version or *semver.Constraints
	nparsed atomic.Int32

	// Now is the clock lifecycle dates are judged by; nil is time.Now.
	Now func() time.Time
}

func (r *Registry) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// maxParsed bounds the constraint cache, since callers choose the strings.
const maxParsed = 256

type entry struct {
	v *semver.Version
	m *Manifest
}

func byVersion(e entry, v *semver.Version) int { return e.v.Compare(v) }

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return new(Registry) }

// Put adds m, replacing any manifest with the same id and version. m must not
// be modified afterwards. Put panics if m.Version is not a semantic version,
// which cannot happen for manifests from Parse.
func (r *Registry) Put(m *Manifest) {
	v := m.ver
	if v == nil {
		var err error
		if v, err = semver.StrictNewVersion(m.Version); err != nil {
			panic(fmt.Sprintf("tools: Put %s: %v", m.Key(), err))
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tools == nil {
		r.tools = map[string][]entry{}
	}
	vs := r.tools[m.ID]
	i, found := slices.BinarySearchFunc(vs, v, byVersion)
	if found {
		vs[i] = entry{v, m}
		return
	}
	r.tools[m.ID] = slices.Insert(vs, i, entry{v, m})
}

// Has reports whether the registry holds exactly version of id.
func (r *Registry) Has(id, version string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.ContainsFunc(r.tools[id], func(e entry) bool { return e.m.Version == version })
}

// Delete removes one version of a tool; it does nothing if there is none.
func (r *Registry) Delete(id, version string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	vs := r.tools[id]
	i := slices.IndexFunc(vs, func(e entry) bool { return e.m.Version == version })
	if i < 0 {
		return
	}
	if len(vs) == 1 {
		delete(r.tools, id)
		return
	}
	r.tools[id] = slices.Delete(vs, i, i+1)
}

// Resolve finds the manifest a request for id at constraint refers to:
//
//   - "" or "latest": the highest active version, releases before
//     pre-releases; only when no version is active, the highest deprecated
//     one (a version whose deprecation_date or sunset_at passed counts as
//     deprecated or sunset, see Manifest.State);
//   - an exact version such as 1.2.3: that version, whatever its lifecycle
//     state, since the route stage reports removed and sunset versions;
//   - a range such as ^1.2, ~1.0.3, ">=1, <2" or 1.x: the highest active or
//     deprecated version in it (the caller chose the range).
//
// Failures are tool_not_found (E3001) for an unknown id,
// tool_version_not_found with E3002 (no such exact version), E3004 (only
// removed or sunset versions) or E3006 (nothing in the range), and
// invalid_parameters (E3006) for a constraint that does not parse.
func (r *Registry) Resolve(id, constraint string) (*Manifest, error) {
	// Parse before taking the lock, to keep the critical section short.
	exact, rng, rngErr := r.parse(constraint)
	now := r.now()

	r.mu.RLock()
	defer r.mu.RUnlock()
	vs := r.tools[id]
	if len(vs) == 0 {
		return nil, r.notFound(id)
	}
	switch {
	case rngErr != nil:
		return nil, api.NewError(api.InvalidParameters, api.EVersionUnsatisfied,
			"tool_version %q is neither a version nor a version range: %v", constraint, rngErr).
			WithDetail("tool_id", id).WithDetail("tool_version", constraint)
	case exact != nil:
		i, found := slices.BinarySearchFunc(vs, exact, byVersion)
		if !found {
			return nil, versionNotFound(api.EVersionNotFound, id, constraint, "tool %q has no version %s", id, constraint)
		}
		return vs[i].m, nil
	case rng != nil:
		for i := len(vs) - 1; i >= 0; i-- {
			if vs[i].m.serving(now) && rng.Check(vs[i].v) {
				return vs[i].m, nil
			}
		}
		return nil, versionNotFound(api.EVersionUnsatisfied, id, constraint,
			"no available version of tool %q satisfies %q", id, constraint)
	}
	if m := latest(vs, now); m != nil {
		return m, nil
	}
	return nil, versionNotFound(api.EToolRemoved, id, constraint,
		"every version of tool %q is sunset or removed", id)
}

// parse classifies a constraint: neither result for latest, an exact version,
// or a range.
func (r *Registry) parse(constraint string) (*semver.Version, *semver.Constraints, error) {
	if constraint == "" || constraint == "latest" {
		return nil, nil, nil
	}
	p, ok := r.parsed.Load(constraint)
	if !ok {
		if v, err := semver.StrictNewVersion(constraint); err == nil {
			p = v
		} else if p, err = semver.NewConstraint(constraint); err != nil {
			return nil, nil, err
		}
		if r.nparsed.Add(1) > maxParsed {
			// Start afresh rather than evict: it is cheap, and the
			// constraints in use come back at once. Racing Stores only
			// blur the bound.
			r.parsed.Clear()
			r.nparsed.Store(1)
		}
		r.parsed.Store(constraint, p)
	}
	if v, ok := p.(*semver.Version); ok {
		return v, nil, nil
	}
	return nil, p.(*semver.Constraints), nil
}

func versionNotFound(ecode, id, constraint, format string, args ...any) *api.Error {
	return api.NewError(api.ToolVersionNotFound, ecode, format, args...).
		WithDetail("tool_id", id).WithDetail("tool_version", constraint)
}

// latest returns the version "latest" means in vs at now, or nil if none
// serves: the highest active release, else the highest active pre-release,
// else the same among deprecated versions.
func latest(vs []entry, now time.Time) *Manifest {
	var found *Manifest
	rank := -1
	for i := len(vs) - 1; i >= 0; i-- {
		e := vs[i]
		r := 0
		switch e.m.State(now) {
		case StateActive:
			r = 2
		case StateDeprecated:
		default:
			continue // sunset or removed
		}
		if e.v.Prerelease() == "" {
			r++
		}
		if r > rank {
			found, rank = e.m, r
		}
	}
	return found
}

// Versions returns every version of a tool, ascending, whatever its state.
func (r *Registry) Versions(id string) []*Manifest {
	r.mu.RLock()
	defer r.mu.RUnlock()
	vs := r.tools[id]
	if len(vs) == 0 {
		return nil
	}
	out := make([]*Manifest, len(vs))
	for i, e := range vs {
		out[i] = e.m
	}
	return out
}

// List returns, sorted by id, the version "latest" resolves to of every tool
// that has one.
func (r *Registry) List() []*Manifest { return r.list(false) }

// ListAll is List with also the tools no version of which serves, each by
// its highest version.
func (r *Registry) ListAll() []*Manifest { return r.list(true) }

func (r *Registry) list(all bool) []*Manifest {
	now := r.now()
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Manifest, 0, len(r.tools))
	for _, vs := range r.tools {
		m := latest(vs, now)
		if m == nil && all {
			m = vs[len(vs)-1].m
		}
		if m != nil {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *Manifest) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Len returns the number of manifests, counting each version of a tool.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, vs := range r.tools {
		n += len(vs)
	}
	return n
}

// notFound is E3001 for id, naming the registered tools nearest to it (by
// edit distance) and where the whole list is. The caller holds r.mu.
func (r *Registry) notFound(id string) *api.Error {
	near := nearest(id, maps.Keys(r.tools), 3)
	msg := fmt.Sprintf("no tool %q", id)
	if len(near) > 0 {
		msg += fmt.Sprintf("; did you mean %s?", strings.Join(near, ", "))
	}
	e := api.NewError(api.ToolNotFound, api.EToolNotFound, "%s (toolgate tools list shows the tools there are)", msg).
		WithDetail("tool_id", id)
	if len(near) > 0 {
		e = e.WithDetail("did_you_mean", near)
	}
	return e
}

// nearest returns up to n of names within an edit distance of a third of
// id's length (at least 2) of id, beginning with it, or ending with it after
// a dot, nearest first: a typo, a name cut short or a missing namespace.
func nearest(id string, names iter.Seq[string], n int) []string {
	type cand struct {
		name string
		d    int
	}
	limit := max(2, len(id)/3)
	var cs []cand
	lower := strings.ToLower(id)
	for name := range names {
		d := levenshtein.ComputeDistance(lower, strings.ToLower(name))
		prefix := len(id) >= 3 && strings.HasPrefix(strings.ToLower(name), lower)
		if d > limit && !prefix && !strings.HasSuffix(name, "."+id) {
			continue
		}
		cs = append(cs, cand{name, d})
	}
	slices.SortFunc(cs, func(a, b cand) int { return cmp.Or(cmp.Compare(a.d, b.d), strings.Compare(a.name, b.name)) })
	out := make([]string, 0, min(n, len(cs)))
	for _, c := range cs[:min(n, len(cs))] {
		out = append(out, c.name)
	}
	return out
}
