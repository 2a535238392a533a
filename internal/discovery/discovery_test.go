package discovery

import (
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

func manifest(t *testing.T, id string, edit func(m map[string]any)) *tools.Manifest {
	t.Helper()
	m := map[string]any{
		"id": id, "name": id, "version": "1.0.0", "description": "a tool", "kind": "builtin",
		"builtin": map[string]any{"function": "noop"}, "input_schema": map[string]any{"type": "object"},
	}
	if edit != nil {
		edit(m)
	}
	b, _ := json.Marshal(m)
	out, err := tools.Parse(b)
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return out
}

func ids(rs []Ranked) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Manifest.ID)
	}
	return out
}

// TestEachFilterMatters: a pair of tools that differ in one property only;
// each filter alone leaves exactly the one it should.
func TestEachFilterMatters(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name   string
		a, b   func(m map[string]any) // a is kept, b left out
		filter Filter
	}{
		{"category", func(m map[string]any) { m["category"] = "utility" }, func(m map[string]any) { m["category"] = "computation" }, Filter{Category: "utility"}},
		{"tag", func(m map[string]any) { m["tags"] = []string{"x"} }, func(m map[string]any) { m["tags"] = []string{"y"} }, Filter{Tag: "x"}},
		{"risk_level_max", func(m map[string]any) { m["safety"] = map[string]any{"risk_level": "medium"} },
			func(m map[string]any) { m["safety"] = map[string]any{"risk_level": "high"} }, Filter{RiskLevelMax: "MED"}},
		{"exclude_side_effects sub-tag", func(m map[string]any) { m["safety"] = map[string]any{"side_effects": []string{"fs.read"}} },
			func(m map[string]any) { m["safety"] = map[string]any{"side_effects": []string{"network.http"}} }, Filter{ExcludeSideEffects: []string{"network"}}},
		{"source_types", nil, func(m map[string]any) {
			m["kind"] = "cli"
			delete(m, "builtin")
			m["cli"] = map[string]any{"command": []string{"true"}}
		}, Filter{SourceTypes: []string{"builtin", "mcp"}}},
		{"enabled_only", nil, func(m map[string]any) { m["lifecycle"] = map[string]any{"state": "deprecated"} }, Filter{EnabledOnly: true}},
		{"enabled_only by date", nil, func(m map[string]any) {
			m["lifecycle"] = map[string]any{"deprecation_date": now.Add(-time.Hour).Format(time.RFC3339)}
		}, Filter{EnabledOnly: true}},
		{"allowed (token)", nil, nil, Filter{Allowed: func(m *tools.Manifest) bool { return m.ID == "a" }}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms := []*tools.Manifest{manifest(t, "a", tt.a), manifest(t, "b", tt.b)}
			if got := ids(Search(ms, Request{}, nil, now)); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("without the filter: %v", got)
			}
			if got := ids(Search(ms, Request{Filter: tt.filter}, nil, now)); !slices.Equal(got, []string{"a"}) {
				t.Fatalf("with the filter: %v, want [a]", got)
			}
		})
	}
}

// TestEachTermOrders: two tools equal but for one ranking input; the term
// alone puts the better one first, whichever id sorts first, and the score
// difference is that term's weight times its difference.
func TestEachTermOrders(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name         string
		better, wrse func(m map[string]any)
		stats        map[string]Stats // by "better"/"worse"
		query        string
		weight       float64
		term         func(api.ScoreTerms) float64
	}{
		{"match", func(m map[string]any) { m["capabilities"] = []string{"parse_json"} }, func(m map[string]any) { m["description"] = "parse things" },
			nil, "parse_json", WeightMatch, func(s api.ScoreTerms) float64 { return s.Match }},
		{"usage", nil, nil, map[string]Stats{"better": {Calls: 100, Successes: 100, P50MS: 1000}, "worse": {Calls: 100, Successes: 1, P50MS: 1000}},
			"", WeightUsage, func(s api.ScoreTerms) float64 { return s.Usage }},
		{"latency (observed)", nil, nil, map[string]Stats{"better": {Calls: 1, P50MS: 10}, "worse": {Calls: 1, P50MS: 5000}},
			"", WeightLatency, func(s api.ScoreTerms) float64 { return s.Latency }},
		{"latency (declared)", func(m map[string]any) { m["cost"] = map[string]any{"typical_latency_ms": 5} },
			func(m map[string]any) { m["cost"] = map[string]any{"typical_latency_ms": 9000} }, nil, "", WeightLatency, func(s api.ScoreTerms) float64 { return s.Latency }},
		{"cost (declared)", nil, func(m map[string]any) { m["cost"] = map[string]any{"per_call": 0.5} }, nil, "", WeightCost, func(s api.ScoreTerms) float64 { return s.Cost }},
		{"cost (observed)", nil, nil, map[string]Stats{"better": {Calls: 1, P50MS: 1000, AvgCost: 0.01}, "worse": {Calls: 1, P50MS: 1000, AvgCost: 2}},
			"", WeightCost, func(s api.ScoreTerms) float64 { return s.Cost }},
		{"safety", nil, func(m map[string]any) { m["safety"] = map[string]any{"risk_level": "critical"} }, nil, "", WeightSafety, func(s api.ScoreTerms) float64 { return s.Safety }},
	}
	for _, tt := range tests {
		for _, order := range [][2]string{{"a", "z"}, {"z", "a"}} {
			t.Run(tt.name+"/"+order[0]+" better", func(t *testing.T) {
				better, worse := manifest(t, order[0], tt.better), manifest(t, order[1], tt.wrse)
				stats := func(id string) (Stats, bool) {
					key := "worse"
					if id == better.ID {
						key = "better"
					}
					s, ok := tt.stats[key]
					return s, ok
				}
				got := Search([]*tools.Manifest{worse, better}, Request{Query: tt.query}, stats, now)
				if len(got) != 2 || got[0].Manifest != better {
					t.Fatalf("order %v, want %s first", ids(got), better.ID)
				}
				dt := tt.term(got[0].Terms) - tt.term(got[1].Terms)
				if dt <= 0 || math.Abs((got[0].Score-got[1].Score)-tt.weight*dt) > 1e-5 {
					t.Fatalf("scores %v %v, term difference %v, weight %v", got[0], got[1], dt, tt.weight)
				}
			})
		}
	}
}

func TestSearchMatches(t *testing.T) {
	now := time.Now()
	ms := []*tools.Manifest{
		manifest(t, "fs.read_file", func(m map[string]any) {
			m["description"] = "Reads a file under the root."
			m["capabilities"] = []string{"read_file"}
		}),
		manifest(t, "json.transform", func(m map[string]any) { m["description"] = "Transforms JSON documents."; m["tags"] = []string{"json"} }),
		manifest(t, "echo", func(m map[string]any) { m["description"] = "Echoes its input." }),
	}
	for _, tc := range []struct {
		query string
		caps  []string
		want  []string
	}{
		{"file", nil, []string{"fs.read_file"}},
		{"JSON", nil, []string{"json.transform"}},
		{"transf", nil, []string{"json.transform"}},          // prefix
		{"echo read", nil, []string{"fs.read_file", "echo"}}, // a capability word outweighs a name
		{"", []string{"read_file"}, []string{"fs.read_file"}},
		{"", []string{"write_file"}, []string{"fs.read_file"}}, // shares the word "file"
		{"nothing-like-it", nil, nil},
	} {
		if got := ids(Search(ms, Request{Query: tc.query, Capabilities: tc.caps}, nil, now)); !slices.Equal(got, tc.want) {
			t.Errorf("search %q %v = %v, want %v", tc.query, tc.caps, got, tc.want)
		}
	}
}

func TestPagination(t *testing.T) {
	var all []Ranked
	for i := range 7 {
		all = append(all, Ranked{Manifest: &tools.Manifest{ID: string(rune('a' + i))}})
	}
	req := api.ListRequest{Query: "x", PageSize: 3}
	var got []string
	for range 5 {
		page, next, size, err := Page(req, all)
		if err != nil || size != 3 {
			t.Fatal(err, size)
		}
		got = append(got, ids(page)...)
		if next == "" {
			break
		}
		req.Cursor = next
	}
	if strings.Join(got, "") != "abcdefg" {
		t.Fatalf("pages gave %v", got)
	}
	// A cursor of another search, or garbage, is E3005.
	c := Cursor(Key(api.ListRequest{Query: "x"}), 3)
	for _, r := range []api.ListRequest{{Query: "y", Cursor: c}, {Query: "x", Cursor: "!!"}} {
		if _, _, _, err := Page(r, all); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.ESearchFailed}) {
			t.Errorf("cursor %q for %q: %v", r.Cursor, r.Query, err)
		}
	}
	if _, _, _, err := Page(api.ListRequest{PageSize: MaxPageSize + 1}, all); err == nil {
		t.Error("oversized page accepted")
	}
	if err := CheckRequest(api.ListRequest{Query: strings.Repeat("a ", 600)}); !errors.Is(err, &api.Error{Code: api.InvalidParameters, ECode: api.ESearchFailed}) {
		t.Errorf("long query: %v", err)
	}
}

func FuzzCursor(f *testing.F) {
	f.Add(Cursor([]byte("k"), 5))
	f.Add("")
	f.Fuzz(func(t *testing.T, c string) {
		if off, ok := Offset(c, []byte("k")); ok && off < 0 {
			t.Fatalf("negative offset %d", off)
		}
	})
}
