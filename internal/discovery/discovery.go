// Package discovery finds tools for an agent: lexical search over ids,
// names, descriptions, tags and capabilities, the registry filters,
// ranking by the formula of docs/discovery.md fed by usage statistics, and
// cursor pagination. It is pure logic over manifests; the control service
// feeds it the registry and the statistics.
package discovery

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

// Ranking weights.
const (
	WeightMatch   = 0.4
	WeightUsage   = 0.2
	WeightLatency = 0.15
	WeightCost    = 0.15
	WeightSafety  = 0.1
)

// Limits of a search request.
const (
	DefaultPageSize = 50
	MaxPageSize     = 200
	MaxQueryBytes   = 1024
	MaxTerms        = 32
)

// Risk levels, least risky first.
var riskLevels = []string{"low", "medium", "high", "critical"}

// RiskRank is the position of level among low, medium, high and critical
// ("med" and upper case accepted), or -1.
func RiskRank(level string) int {
	l := strings.ToLower(level)
	if l == "med" {
		l = "medium"
	}
	return slices.Index(riskLevels, l)
}

// Filter decides which tools a search considers. The zero Filter keeps all.
type Filter struct {
	Category           string
	Tag                string
	RiskLevelMax       string
	ExcludeSideEffects []string
	SourceTypes        []string
	EnabledOnly        bool
	// Allowed, when set, keeps only the tools it accepts (what a token may
	// call).
	Allowed func(*tools.Manifest) bool
}

// Keep reports whether m passes f at now.
func (f Filter) Keep(m *tools.Manifest, now time.Time) bool {
	switch {
	case f.Category != "" && m.Category != f.Category:
		return false
	case f.Tag != "" && !slices.Contains(m.Tags, f.Tag):
		return false
	case f.RiskLevelMax != "" && RiskRank(m.Safety.RiskLevel) > RiskRank(f.RiskLevelMax):
		return false
	case len(f.SourceTypes) > 0 && !slices.Contains(f.SourceTypes, m.Kind):
		return false
	case f.EnabledOnly && m.State(now) != tools.StateActive:
		return false
	case HasSideEffect(m.Safety.SideEffects, f.ExcludeSideEffects):
		return false
	case f.Allowed != nil && !f.Allowed(m):
		return false
	}
	return true
}

// HasSideEffect reports whether one of effects is one of excluded or a
// sub-tag of one ("network" excludes "network.http").
func HasSideEffect(effects, excluded []string) bool {
	for _, e := range effects {
		for _, x := range excluded {
			if e == x || strings.HasPrefix(e, x+".") {
				return true
			}
		}
	}
	return false
}

// Stats is what ranking knows of a tool's calls.
type Stats struct {
	Calls, Successes int64
	P50MS            float64
	AvgCost          float64
}

// Request is a search: what to look for and how to filter.
type Request struct {
	Query        string
	Capabilities []string
	Filter       Filter
}

// Ranked is one tool a search found, with its score.
type Ranked struct {
	Manifest *tools.Manifest
	Score    float64
	Terms    api.ScoreTerms
}

// Search returns the tools of ms that pass the filter and match the query
// and capabilities, best first (ties by id). Without query and capabilities
// every tool matches fully and the order is by the other terms. stats may
// be nil.
func Search(ms []*tools.Manifest, req Request, stats func(id string) (Stats, bool), now time.Time) []Ranked {
	words := Words(req.Query)
	var out []Ranked
	for _, m := range ms {
		if !req.Filter.Keep(m, now) {
			continue
		}
		match := Match(m, words, req.Capabilities)
		if match == 0 {
			continue
		}
		var st Stats
		if stats != nil {
			st, _ = stats(m.ID)
		}
		t := Terms(m, match, st)
		out = append(out, Ranked{Manifest: m, Score: Score(t), Terms: t})
	}
	slices.SortStableFunc(out, func(a, b Ranked) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		return strings.Compare(a.Manifest.ID, b.Manifest.ID)
	})
	return out
}

// Score combines the terms with the seed's weights.
func Score(t api.ScoreTerms) float64 {
	s := WeightMatch*t.Match + WeightUsage*t.Usage + WeightLatency*t.Latency + WeightCost*t.Cost + WeightSafety*t.Safety
	return math.Round(s*1e6) / 1e6
}

// Terms computes a tool's ranking terms, each in [0, 1]:
//
//   - match: as given (Match);
//   - usage: ln(1 + successful calls) / 10, at most 1;
//   - latency: 1 / (1 + seconds), from the observed median when the tool
//     has calls, else the manifest's cost.typical_latency_ms, else 1 s;
//   - cost: 1 / (1 + 10·cost per call), from the observed mean when the
//     tool has calls, else the manifest's cost.per_call; free is 1;
//   - safety: 0.5 for a dangerous tool (risk high or critical, or approval
//     required), else 1.
func Terms(m *tools.Manifest, match float64, st Stats) api.ScoreTerms {
	t := api.ScoreTerms{Match: match, Safety: 1}
	t.Usage = min(math.Log1p(float64(st.Successes))/10, 1)
	latencyMS := 1000.0
	switch {
	case st.Calls > 0:
		latencyMS = st.P50MS
	case m.Cost != nil && m.Cost.TypicalLatencyMS > 0:
		latencyMS = float64(m.Cost.TypicalLatencyMS)
	}
	t.Latency = 1 / (1 + latencyMS/1000)
	cost := 0.0
	switch {
	case st.Calls > 0:
		cost = st.AvgCost
	case m.Cost != nil:
		cost = m.Cost.PerCall
	}
	t.Cost = 1 / (1 + cost*10)
	if RiskRank(m.Safety.RiskLevel) >= RiskRank("high") || m.Safety.RequiresApproval {
		t.Safety = 0.5
	}
	return t
}

// Words splits a query into lower-case words: letters and digits, split at
// anything else (spaces, dots, underscores, colons, dashes).
func Words(s string) []string {
	f := strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
	slices.Sort(f)
	return slices.Compact(f)
}

// Match is how well m answers the query words and wanted capabilities, in
// [0, 1]; 0 leaves the tool out. Each query word scores by the best place
// it is found: 1 as a capability or tag word, 0.8 in the id or name, 0.5 in
// the description, half that as a prefix of such a word. Each capability
// scores 1 when m has it among capabilities or tags, 0.5 when it only
// shares a word with one. The match is the mean over the words and
// capabilities asked for; with neither it is 1.
func Match(m *tools.Manifest, words, capabilities []string) float64 {
	if len(words) == 0 && len(capabilities) == 0 {
		return 1
	}
	tagged := slices.Concat(m.Capabilities, m.Tags)
	fields := []struct {
		words  []string
		weight float64
	}{
		{Words(strings.Join(tagged, " ")), 1},
		{Words(m.ID + " " + m.Name), 0.8},
		{Words(m.Description), 0.5},
	}
	total, found := 0.0, false
	for _, w := range words {
		best := 0.0
		for _, f := range fields {
			for _, fw := range f.words {
				switch {
				case fw == w:
					best = max(best, f.weight)
				case len(w) >= 3 && strings.HasPrefix(fw, w):
					best = max(best, f.weight/2)
				}
			}
		}
		total += best
		found = found || best > 0
	}
	tagWords := fields[0].words
	for _, c := range capabilities {
		switch {
		case slices.Contains(tagged, c):
			total++
			found = true
		case slices.ContainsFunc(Words(c), func(w string) bool { return slices.Contains(tagWords, w) }):
			total += 0.5
			found = true
		}
	}
	if !found {
		return 0
	}
	return math.Round(total/float64(len(words)+len(capabilities))*1e6) / 1e6
}

// Cursor encodes the position after the first offset results of the
// search fingerprinted by key.
func Cursor(key []byte, offset int) string {
	b := make([]byte, 8, 16)
	binary.BigEndian.PutUint64(b, uint64(offset))
	sum := sha256.Sum256(key)
	return base64.RawURLEncoding.EncodeToString(append(b, sum[:8]...))
}

// Offset decodes a cursor made by Cursor for the same key; ok is false for
// anything else.
func Offset(cursor string, key []byte) (int, bool) {
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(b) != 16 {
		return 0, false
	}
	sum := sha256.Sum256(key)
	if string(b[8:]) != string(sum[:8]) {
		return 0, false
	}
	off := binary.BigEndian.Uint64(b[:8])
	if off > math.MaxInt32 {
		return 0, false
	}
	return int(off), true
}

// Key fingerprints a list request for its cursors: the same filters and
// query, whatever the page size and cursor.
func Key(r api.ListRequest) []byte {
	r.Cursor, r.PageSize = "", 0
	b, _ := json.Marshal(r)
	return b
}

// Page answers a list request from ranked results: validates the cursor and
// page size (E3005 for a cursor from another request, E3016 for a bad page
// size) and returns the page and the next cursor.
func Page(r api.ListRequest, all []Ranked) ([]Ranked, string, int, error) {
	size := r.PageSize
	switch {
	case size == 0:
		size = DefaultPageSize
	case size < 0 || size > MaxPageSize:
		return nil, "", 0, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"page_size %d is outside 1-%d", r.PageSize, MaxPageSize)
	}
	off := 0
	if r.Cursor != "" {
		var ok bool
		if off, ok = Offset(r.Cursor, Key(r)); !ok {
			return nil, "", 0, api.NewError(api.InvalidParameters, api.ESearchFailed,
				"the cursor does not belong to this search (filters and query must stay the same)")
		}
	}
	if off > len(all) {
		off = len(all)
	}
	end := min(off+size, len(all))
	next := ""
	if end < len(all) {
		next = Cursor(Key(r), end)
	}
	return all[off:end], next, size, nil
}

// CheckRequest refuses a search request over the limits (E3005).
func CheckRequest(r api.ListRequest) error {
	if len(r.Query) > MaxQueryBytes {
		return api.NewError(api.InvalidParameters, api.ESearchFailed, "query is %d bytes; at most %d", len(r.Query), MaxQueryBytes)
	}
	if n := len(Words(r.Query)) + len(r.Capabilities); n > MaxTerms {
		return api.NewError(api.InvalidParameters, api.ESearchFailed, "the search has %d words and capabilities; at most %d", n, MaxTerms)
	}
	if r.RiskLevelMax != "" && RiskRank(r.RiskLevelMax) < 0 {
		return api.NewError(api.InvalidParameters, api.ERequestInvalid, "risk_level_max %q is none of low, medium, high, critical", r.RiskLevelMax)
	}
	return nil
}
