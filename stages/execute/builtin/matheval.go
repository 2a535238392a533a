package builtin

import (
	"context"
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Limits of math.eval.
const (
	maxExprBytes = 1 << 10
	maxExprDepth = 64
	// maxExprBits bounds every intermediate value (numerator plus
	// denominator of an exact rational), so no product or power can grow
	// without bound.
	maxExprBits = 4096
	// maxLiteralExp bounds a literal's decimal exponent: 1e999999999 is a
	// dozen bytes but a huge exact rational.
	maxLiteralExp = 1000
)

// mathEval evaluates an arithmetic expression. The text is parsed by Go's own
// expression parser, so there is no tokenizer here to get wrong, and only
// number literals, + - * / %, unary signs, parentheses and a few functions are
// evaluated; anything else in the tree is refused. Arithmetic is exact
// (go/constant rationals) except for sqrt and fractional powers.
func mathEval(_ context.Context, params json.RawMessage) (json.RawMessage, error) {
	var p struct {
		Expression string `json:"expression"`
	}
	if err := decode(params, &p); err != nil {
		return nil, err
	}
	v, approx, err := evalExpr(p.Expression)
	if err != nil {
		return nil, err
	}
	n, exact, err := jsonNumber(v)
	exact = exact && !approx
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"result": n, "exact": exact})
}

// evalExpr parses and evaluates one expression; approx reports that sqrt or
// a fractional power made the value a float64 approximation.
func evalExpr(expr string) (v constant.Value, approx bool, err error) {
	if strings.TrimSpace(expr) == "" {
		return nil, false, invalid("expression is empty")
	}
	if len(expr) > maxExprBytes {
		return nil, false, tooLarge("expression is %d bytes, the limit is %d", len(expr), maxExprBytes)
	}
	tree, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, false, invalid("expression does not parse: %v", err)
	}
	var ev evaluator
	v, err = ev.eval(tree, 0)
	return v, ev.approx, err
}

// evaluator walks one expression tree.
type evaluator struct{ approx bool }

type mathFunc struct {
	minArgs, maxArgs int // maxArgs < 0: any number
	fn               func(args []constant.Value) (constant.Value, error)
}

var mathFuncs = map[string]mathFunc{
	"abs":   {1, 1, func(a []constant.Value) (constant.Value, error) { return absVal(a[0]), nil }},
	"min":   {1, -1, func(a []constant.Value) (constant.Value, error) { return pick(a, token.LSS), nil }},
	"max":   {1, -1, func(a []constant.Value) (constant.Value, error) { return pick(a, token.GTR), nil }},
	"floor": {1, 1, func(a []constant.Value) (constant.Value, error) { return floorVal(a[0]), nil }},
	"ceil": {1, 1, func(a []constant.Value) (constant.Value, error) {
		return constant.UnaryOp(token.SUB, floorVal(constant.UnaryOp(token.SUB, a[0], 0)), 0), nil
	}},
	// round: half away from zero, as math.Round.
	"round": {1, 1, func(a []constant.Value) (constant.Value, error) {
		half := constant.MakeFromLiteral("0.5", token.FLOAT, 0)
		r := floorVal(constant.BinaryOp(absVal(a[0]), token.ADD, half))
		if constant.Sign(a[0]) < 0 {
			r = constant.UnaryOp(token.SUB, r, 0)
		}
		return r, nil
	}},
	"sqrt": {1, 1, func(a []constant.Value) (constant.Value, error) {
		if constant.Sign(a[0]) < 0 {
			return nil, invalid("sqrt of a negative number")
		}
		f, _ := constant.Float64Val(a[0])
		return floatResult(math.Sqrt(f))
	}},
	"pow": {2, 2, func(a []constant.Value) (constant.Value, error) { return powVal(a[0], a[1]) }},
}

func (ev *evaluator) eval(n ast.Expr, depth int) (constant.Value, error) {
	if depth > maxExprDepth {
		return nil, tooLarge("expression nests deeper than %d levels", maxExprDepth)
	}
	var v constant.Value
	var err error
	switch e := n.(type) {
	case *ast.BasicLit:
		v, err = literal(e)
	case *ast.ParenExpr:
		v, err = ev.eval(e.X, depth+1)
	case *ast.UnaryExpr:
		if e.Op != token.SUB && e.Op != token.ADD {
			return nil, invalid("operator %s is not supported", e.Op)
		}
		if v, err = ev.eval(e.X, depth+1); err == nil {
			v = constant.UnaryOp(e.Op, v, 0)
		}
	case *ast.BinaryExpr:
		v, err = ev.binary(e, depth)
	case *ast.CallExpr:
		v, err = ev.call(e, depth)
	case *ast.Ident:
		return nil, invalid("unknown name %q: only numbers and the functions abs, min, max, sqrt, floor, ceil, pow, round are allowed", e.Name)
	default:
		return nil, invalid("%s is not supported in an arithmetic expression", nodeName(n))
	}
	if err != nil {
		return nil, err
	}
	return v, checkSize(v)
}

func literal(e *ast.BasicLit) (constant.Value, error) {
	if e.Kind != token.INT && e.Kind != token.FLOAT {
		return nil, invalid("literal %s is not a number", e.Value)
	}
	lit := strings.ToLower(strings.ReplaceAll(e.Value, "_", ""))
	if e.Kind == token.FLOAT && !strings.HasPrefix(lit, "0x") {
		if i := strings.IndexByte(lit, 'e'); i >= 0 {
			if x, err := strconv.Atoi(strings.TrimPrefix(lit[i+1:], "+")); err != nil || x > maxLiteralExp || x < -maxLiteralExp {
				return nil, tooLarge("exponent of %s is out of range (at most %d)", e.Value, maxLiteralExp)
			}
		}
	}
	if e.Kind == token.FLOAT && strings.HasPrefix(lit, "0x") {
		if i := strings.IndexByte(lit, 'p'); i >= 0 {
			if x, err := strconv.Atoi(strings.TrimPrefix(lit[i+1:], "+")); err != nil || x > 4*maxLiteralExp || x < -4*maxLiteralExp {
				return nil, tooLarge("exponent of %s is out of range", e.Value)
			}
		}
	}
	v := constant.MakeFromLiteral(e.Value, e.Kind, 0)
	if v.Kind() == constant.Unknown {
		return nil, invalid("literal %s is not a valid number", e.Value)
	}
	return v, nil
}

func (ev *evaluator) binary(e *ast.BinaryExpr, depth int) (constant.Value, error) {
	switch e.Op {
	case token.ADD, token.SUB, token.MUL, token.QUO, token.REM:
	default:
		return nil, invalid("operator %s is not supported", e.Op)
	}
	x, err := ev.eval(e.X, depth+1)
	if err != nil {
		return nil, err
	}
	y, err := ev.eval(e.Y, depth+1)
	if err != nil {
		return nil, err
	}
	switch e.Op {
	case token.QUO:
		if constant.Sign(y) == 0 {
			return nil, invalid("division by zero")
		}
	case token.REM:
		x, y = constant.ToInt(x), constant.ToInt(y)
		if x.Kind() != constant.Int || y.Kind() != constant.Int {
			return nil, invalid("%% needs whole numbers")
		}
		if constant.Sign(y) == 0 {
			return nil, invalid("modulo by zero")
		}
	}
	// QUO of two integers is exact division here (go/constant's rule),
	// not Go's truncating integer division.
	return constant.BinaryOp(x, e.Op, y), nil
}

func (ev *evaluator) call(e *ast.CallExpr, depth int) (constant.Value, error) {
	id, ok := e.Fun.(*ast.Ident)
	if !ok {
		return nil, invalid("only the functions abs, min, max, sqrt, floor, ceil, pow, round may be called")
	}
	f, ok := mathFuncs[id.Name]
	if !ok {
		return nil, invalid("function %q is not allowed: only abs, min, max, sqrt, floor, ceil, pow, round", id.Name)
	}
	if e.Ellipsis.IsValid() {
		return nil, invalid("... is not supported")
	}
	if len(e.Args) < f.minArgs || (f.maxArgs >= 0 && len(e.Args) > f.maxArgs) {
		return nil, invalid("%s takes %s", id.Name, arity(f))
	}
	args := make([]constant.Value, len(e.Args))
	for i, a := range e.Args {
		v, err := ev.eval(a, depth+1)
		if err != nil {
			return nil, err
		}
		args[i] = v
	}
	if id.Name == "sqrt" || (id.Name == "pow" && constant.ToInt(args[1]).Kind() != constant.Int) {
		ev.approx = true
	}
	return f.fn(args)
}

func arity(f mathFunc) string {
	switch {
	case f.maxArgs < 0:
		return "at least " + strconv.Itoa(f.minArgs) + " argument(s)"
	case f.minArgs == 1 && f.maxArgs == 1:
		return "one argument"
	default:
		return strconv.Itoa(f.minArgs) + " arguments"
	}
}

func absVal(v constant.Value) constant.Value {
	if constant.Sign(v) < 0 {
		return constant.UnaryOp(token.SUB, v, 0)
	}
	return v
}

func pick(vs []constant.Value, op token.Token) constant.Value {
	best := vs[0]
	for _, v := range vs[1:] {
		if constant.Compare(v, op, best) {
			best = v
		}
	}
	return best
}

// floorVal is the largest integer not above v. big.Int.Div is Euclidean, which
// with the positive denominator of a rational is floor division.
func floorVal(v constant.Value) constant.Value {
	if v.Kind() == constant.Int {
		return v
	}
	num, den := constant.Num(v), constant.Denom(v)
	nb, _ := new(big.Int).SetString(num.ExactString(), 10)
	db, _ := new(big.Int).SetString(den.ExactString(), 10)
	return constant.Make(new(big.Int).Div(nb, db))
}

// powVal raises x to y: exactly by squaring for whole exponents, whose size
// checkSize bounds step by step, and in float64 otherwise.
func powVal(x, y constant.Value) (constant.Value, error) {
	if constant.ToInt(y).Kind() != constant.Int {
		if constant.Sign(x) < 0 {
			return nil, invalid("a negative number to a fractional power")
		}
		fx, _ := constant.Float64Val(x)
		fy, _ := constant.Float64Val(y)
		return floatResult(math.Pow(fx, fy))
	}
	y = constant.ToInt(y)
	e, ok := constant.Int64Val(y)
	if !ok || e > maxExprBits || e < -maxExprBits {
		return nil, tooLarge("exponent %s is out of range (at most %d)", y.ExactString(), maxExprBits)
	}
	neg := e < 0
	if neg {
		if constant.Sign(x) == 0 {
			return nil, invalid("division by zero")
		}
		e = -e
	}
	result := constant.MakeInt64(1)
	base := x
	for e > 0 {
		if e&1 == 1 {
			result = constant.BinaryOp(result, token.MUL, base)
			if err := checkSize(result); err != nil {
				return nil, err
			}
		}
		if e >>= 1; e > 0 {
			base = constant.BinaryOp(base, token.MUL, base)
			if err := checkSize(base); err != nil {
				return nil, err
			}
		}
	}
	if neg {
		result = constant.BinaryOp(constant.MakeInt64(1), token.QUO, result)
	}
	return result, nil
}

func floatResult(f float64) (constant.Value, error) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, invalid("the result is not a finite number")
	}
	return constant.MakeFloat64(f), nil
}

// checkSize refuses values too large to keep computing with exactly.
func checkSize(v constant.Value) error {
	bits := 0
	switch v.Kind() {
	case constant.Int:
		bits = constant.BitLen(v)
	case constant.Float:
		// Num and Denom are Unknown for values too far from 1 to hold
		// as a fraction at all.
		num, den := constant.Num(v), constant.Denom(v)
		if num.Kind() != constant.Int || den.Kind() != constant.Int {
			return tooLarge("a value in the expression is out of range")
		}
		bits = constant.BitLen(num) + constant.BitLen(den)
	default:
		return invalid("the expression does not evaluate to a number")
	}
	if bits > maxExprBits {
		return tooLarge("a value in the expression is too large (over %d bits)", maxExprBits)
	}
	return nil
}

// jsonNumber renders v as a JSON number: integers in full, other values as
// the nearest float64. exact tells whether the number is v itself.
func jsonNumber(v constant.Value) (json.Number, bool, error) {
	if i := constant.ToInt(v); i.Kind() == constant.Int {
		v = i
		return json.Number(v.ExactString()), true, nil
	}
	f, exact := constant.Float64Val(v)
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return "", false, invalid("the result is not a finite number")
	}
	return json.Number(strconv.FormatFloat(f, 'g', -1, 64)), exact, nil
}

func nodeName(n ast.Expr) string {
	switch n.(type) {
	case *ast.SelectorExpr:
		return "a selector (a.b)"
	case *ast.IndexExpr, *ast.IndexListExpr:
		return "indexing"
	case *ast.SliceExpr:
		return "slicing"
	case *ast.StarExpr:
		return "a dereference (for powers, write pow(x, y))"
	case *ast.CompositeLit:
		return "a composite literal"
	case *ast.FuncLit:
		return "a function literal"
	case *ast.TypeAssertExpr:
		return "a type assertion"
	default:
		return "this construct"
	}
}
