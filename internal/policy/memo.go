package policy

import (
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// A policy's decision is a function of its data, which an Engine holds
// fixed, and of the parts of the input its rules read. When every rule
// reads the input only through refs that name a part of it by field names
// (input.tool, input.claims.budget.max_calls), and calls nothing whose
// result depends on more than its arguments (time.now_ns, rand.intn,
// certificate checks against the clock), the decision on an input is the
// decision on any earlier input that holds the same values at those parts.
// Most calls of a tool with one token differ only where the policy does
// not look (the invocation's id, its parameters, the time), so a decision
// is kept by those values and read back instead of evaluated again.
//
// OPA's own partial evaluation does not take this work away: it leaves
// rules with else (the shipped decision) as they are, and the rules over
// the input it keeps are the same ones evaluated in the same way.

// maxMemoDecisions bounds the decisions an Engine keeps; past it the memo
// starts again empty. maxMemoCollisions bounds those kept under one hash,
// so that no lookup compares more keys than that.
const (
	maxMemoDecisions  = 4096
	maxMemoCollisions = 8
)

// memo keeps decisions by the values of the input parts a policy reads.
type memo struct {
	// reads are the parts: paths of field names under input, none a
	// prefix of another, in order.
	reads [][]*ast.Term
	// shared[i] is how many names reads[i] begins with that reads[i-1]
	// begins with too: key looks those up once.
	shared []int
	mu     sync.Mutex
	m      map[int][]memoEntry
	n      int
	// hits counts decisions read back (tests see the memo work).
	hits int
}

type memoEntry struct {
	key []readValue
	d   Decision
}

// readValue is what an input holds at one read path: the value at depth
// along the path, where the walk stopped at a value that is not an object
// (or at the end), or undefined (v nil) when an object at depth lacks the
// next field, which leaves the whole path undefined.
type readValue struct {
	depth int
	v     ast.Value
}

// clockBuiltins read the clock without being marked nondeterministic: they
// check certificates against the current time when not given one.
var clockBuiltins = map[string]bool{
	"crypto.x509.parse_and_verify_certificates":              true,
	"crypto.x509.parse_and_verify_certificates_with_options": true,
}

// newMemo returns the memo for the modules c holds, or nil when their
// decision may depend on more than the values at fixed input paths: the
// input read whole or by a computed key at its root, a with modifier, or
// a builtin that is not a function of its arguments.
func newMemo(c *ast.Compiler) *memo {
	var paths [][]string
	ok := true
	var vis *ast.GenericVisitor
	// getAlong reads a call's operands when it is object.get of a named
	// part of the input along a path of field names: what it returns
	// depends only on the input's value along that path (the walk a key
	// holds), so the path is read, not the whole part. The shipped policy
	// reads the claims so, which then key the memo by the grants and
	// budget it looks at, not by the token's id and times.
	getAlong := func(op ast.Ref, operands []*ast.Term) bool {
		if !op.Equal(ast.ObjectGet.Ref()) || len(operands) < 3 {
			return false
		}
		p, ok := inputPath(operands[0], operands[1])
		if !ok {
			return false
		}
		paths = append(paths, p)
		for _, t := range operands[2:] { // the default, and the output
			vis.Walk(t)
		}
		return true
	}
	vis = ast.NewGenericVisitor(func(x any) bool {
		if !ok {
			return true
		}
		switch x := x.(type) {
		case *ast.Expr:
			if len(x.With) > 0 || x.IsCall() && impure(x.Operator()) {
				ok = false
			}
			if ok && x.IsCall() && getAlong(x.Operator(), x.Operands()) {
				return true
			}
		case ast.Call:
			if len(x) > 0 {
				if r, isRef := x[0].Value.(ast.Ref); isRef && impure(r) {
					ok = false
				}
				if r, isRef := x[0].Value.(ast.Ref); ok && isRef && getAlong(r, x[1:]) {
					return true
				}
			}
		case ast.Ref:
			if !x.HasPrefix(ast.InputRootRef) {
				return false
			}
			prefix := x.StringPrefix()
			if len(prefix) < 2 {
				ok = false
				return true
			}
			p := make([]string, len(prefix)-1)
			for i, t := range prefix[1:] {
				p[i] = string(t.Value.(ast.String))
			}
			paths = append(paths, p)
			// The computed parts of a ref may read the input too.
			for _, t := range x[len(prefix):] {
				vis.Walk(t)
			}
			return true
		case ast.Var:
			// The input anywhere but at the head of a ref (handled
			// above) is the input whole.
			if x.Equal(ast.InputRootDocument.Value) {
				ok = false
			}
		}
		return false
	})
	for _, m := range c.Modules {
		vis.Walk(m)
	}
	if !ok {
		return nil
	}
	// A path under another is read with it.
	slices.SortFunc(paths, slices.Compare)
	var reads [][]*ast.Term
	var shared []int
	var last []string
	for i, p := range paths {
		if i > 0 && hasPrefix(p, paths[i-1]) {
			paths[i] = paths[i-1] // what the next path is compared with
			continue
		}
		terms := make([]*ast.Term, len(p))
		for j, name := range p {
			terms[j] = ast.StringTerm(name)
		}
		n := 0
		for n < len(last) && n < len(p) && last[n] == p[n] {
			n++
		}
		reads, shared, last = append(reads, terms), append(shared, n), p
	}
	return &memo{reads: reads, shared: shared}
}

// inputPath returns the field names under input that obj names followed
// by those of key (a name, or an array of names, object.get's path), when
// obj is a ref to a named part of the input and key is made of names.
func inputPath(obj, key *ast.Term) ([]string, bool) {
	r, isRef := obj.Value.(ast.Ref)
	if !isRef || !r.HasPrefix(ast.InputRootRef) {
		return nil, false
	}
	prefix := r.StringPrefix()
	if len(prefix) < 2 || len(prefix) != len(r) {
		return nil, false
	}
	var p []string
	for _, t := range prefix[1:] {
		p = append(p, string(t.Value.(ast.String)))
	}
	switch k := key.Value.(type) {
	case ast.String:
		return append(p, string(k)), true
	case *ast.Array:
		for i := range k.Len() {
			name, isName := k.Elem(i).Value.(ast.String)
			if !isName {
				return nil, false
			}
			p = append(p, string(name))
		}
		return p, true
	}
	return nil, false
}

func hasPrefix(p, prefix []string) bool {
	return len(p) >= len(prefix) && slices.Equal(p[:len(prefix)], prefix)
}

// impure says whether the builtin op names may return different results
// for the same arguments.
func impure(op ast.Ref) bool {
	b, ok := ast.BuiltinMap[op.String()]
	return ok && (b.Nondeterministic || clockBuiltins[b.Name])
}

// key appends input's values at the memo's paths to key, and returns
// them with their hash.
func (m *memo) key(input ast.Value, key []readValue) ([]readValue, int) {
	h := 0
	// at[k] is the value the last path led to after its first k names,
	// each found: a path that begins with the same names starts from
	// there, where the walk from the input would have come.
	var stack [8]ast.Value
	at := append(stack[:0], input)
	for i, p := range m.reads {
		k := min(m.shared[i], len(at)-1)
		at = at[:k+1]
		v, depth := at[k], k
		for _, name := range p[k:] {
			obj, isObj := v.(ast.Object)
			if !isObj {
				break
			}
			t := obj.Get(name)
			depth++
			if t == nil {
				v = nil
				break
			}
			v = t.Value
			at = append(at, v)
		}
		key = append(key, readValue{depth: depth, v: v})
		h = h*31 + depth
		if v != nil {
			h = h*31 + v.Hash()
		}
	}
	return key, h
}

func (m *memo) get(key []readValue, h int) (Decision, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.m[h] {
		if sameReads(e.key, key) {
			m.hits++
			return e.d, true
		}
	}
	return Decision{}, false
}

// put keeps d under a copy of key.
func (m *memo) put(key []readValue, h int, d Decision) {
	kept := slices.Clone(key)
	// A caller appending to the reasons gets its own array.
	d.Reasons = slices.Clip(d.Reasons)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil || m.n >= maxMemoDecisions {
		m.m, m.n = map[int][]memoEntry{}, 0
	}
	if len(m.m[h]) >= maxMemoCollisions {
		return
	}
	m.m[h] = append(m.m[h], memoEntry{key: kept, d: d})
	m.n++
}

func sameReads(a, b []readValue) bool {
	for i := range a {
		if a[i].depth != b[i].depth || (a[i].v == nil) != (b[i].v == nil) || a[i].v != nil && !identical(a[i].v, b[i].v) {
			return false
		}
	}
	return true
}

// identical says whether a and b are the same JSON value, written the same
// way: unlike ast.Compare, 1 and 1.0 differ (sprintf shows them apart).
// Values other than JSON's (sets, non-string keys) are never identical,
// which only costs an evaluation.
func identical(a, b ast.Value) bool {
	switch a := a.(type) {
	case ast.String:
		b, ok := b.(ast.String)
		return ok && a == b
	case ast.Number:
		b, ok := b.(ast.Number)
		return ok && a == b
	case ast.Boolean:
		b, ok := b.(ast.Boolean)
		return ok && a == b
	case ast.Null:
		_, ok := b.(ast.Null)
		return ok
	case *ast.Array:
		b, ok := b.(*ast.Array)
		if !ok || a.Len() != b.Len() {
			return false
		}
		if a == b {
			return true
		}
		for i := range a.Len() {
			if !identical(a.Elem(i).Value, b.Elem(i).Value) {
				return false
			}
		}
		return true
	case ast.Object:
		b, ok := b.(ast.Object)
		if !ok || a.Len() != b.Len() {
			return false
		}
		if any(a) == any(b) {
			return true
		}
		same := true
		a.Until(func(k, v *ast.Term) bool {
			_, str := k.Value.(ast.String)
			w := b.Get(k)
			same = str && w != nil && identical(v.Value, w.Value)
			return !same
		})
		return same
	}
	return false
}

// Reads says whether the policy may read the input at path (field names
// under input) or under it: false only when its rules read the input
// through named parts alone and none of them is path, under it or above
// it. A caller may leave out of the input what the policy never reads.
func (e *Engine) Reads(path ...string) bool {
	if e.memo == nil {
		return true
	}
	for _, p := range e.memo.reads {
		n := min(len(p), len(path))
		same := true
		for i := range n {
			if string(p[i].Value.(ast.String)) != path[i] {
				same = false
				break
			}
		}
		if same {
			return true
		}
	}
	return false
}
