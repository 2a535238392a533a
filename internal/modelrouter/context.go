package modelrouter

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Strategies beyond dropping messages: the request keeps
// what it needs, in fewer tokens.
const (
	// TruncateSummarize replaces the oldest messages (the cold context) by
	// a summary a model writes; the system prompt and the most recent
	// messages stay as they are.
	TruncateSummarize = "summarize"
	// TruncateSplit sends the last message in parts that each fit, one
	// call per part with the same system prompt, and joins the answers.
	TruncateSplit = "split"
	// TruncateRetrieve keeps the last message and, of everything before
	// it, only the passages most relevant to it (BM25), in their order.
	TruncateRetrieve = "retrieve"
)

// Strategies lists every truncation strategy a request may name.
var Strategies = []string{TruncateNone, TruncateOldest, TruncateMiddle, TruncateSummarize, TruncateSplit, TruncateRetrieve}

// Passages cuts text into pieces of at most max tokens, at paragraph
// breaks where it can, then at sentence ends, then between words; a word
// longer than max is cut where it must be. Joined with "\n\n" they give
// back the text's words in order.
func Passages(text string, max int) []string {
	if max < 1 {
		max = 1
	}
	var out []string
	var cur strings.Builder
	curTokens := 0
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
		curTokens = 0
	}
	add := func(piece, sep string) {
		n := CountText(piece)
		if curTokens > 0 {
			if curTokens+n+1 > max-8 {
				// Near the bound, count exactly: tokens do not add up
				// across a join.
				if exact := CountText(cur.String() + sep + piece); exact <= max {
					cur.WriteString(sep + piece)
					curTokens = exact
					return
				}
				flush()
			} else {
				cur.WriteString(sep)
				n++
			}
		}
		cur.WriteString(piece)
		curTokens += n
	}
	for _, para := range strings.Split(text, "\n\n") {
		if strings.TrimSpace(para) == "" {
			continue
		}
		if n := CountText(para); n <= max {
			add(para, "\n\n")
			continue
		}
		flush()
		for _, sent := range sentences(para) {
			if CountText(sent) <= max {
				add(sent, " ")
				continue
			}
			for _, w := range strings.Fields(sent) {
				for _, part := range cutWord(w, max) {
					add(part, " ")
				}
			}
		}
		flush()
	}
	flush()
	return out
}

// sentences splits a paragraph after '.', '!' or '?' followed by a space.
func sentences(p string) []string {
	var out []string
	start := 0
	for i := 0; i < len(p)-1; i++ {
		if (p[i] == '.' || p[i] == '!' || p[i] == '?') && (p[i+1] == ' ' || p[i+1] == '\n') {
			out = append(out, strings.TrimSpace(p[start:i+1]))
			start = i + 1
		}
	}
	if s := strings.TrimSpace(p[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// cutWord cuts a run without spaces into pieces of at most max tokens.
func cutWord(w string, max int) []string {
	if CountText(w) <= max {
		return []string{w}
	}
	r := []rune(w)
	// A token is at least one rune: max runes always fit.
	var out []string
	for len(r) > 0 {
		n := min(len(r), max*4)
		for n > 1 && CountText(string(r[:n])) > max {
			n = n * 3 / 4
		}
		out = append(out, string(r[:n]))
		r = r[n:]
	}
	return out
}

// terms are the lower-cased words and numbers of s.
func terms(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsNumber(r)
	})
}

// BM25 parameters, the usual ones.
const (
	bm25K1 = 1.2
	bm25B  = 0.75
)

// Rank scores each passage against query with Okapi BM25 and returns the
// passages' indexes, best first (ties keep the passages' order).
func Rank(query string, passages []string) []int {
	q := terms(query)
	docs := make([]map[string]int, len(passages))
	lens := make([]int, len(passages))
	df := map[string]int{}
	total := 0
	for i, p := range passages {
		docs[i] = map[string]int{}
		for _, t := range terms(p) {
			if docs[i][t] == 0 {
				df[t]++
			}
			docs[i][t]++
			lens[i]++
		}
		total += lens[i]
	}
	avg := 1.0
	if len(passages) > 0 && total > 0 {
		avg = float64(total) / float64(len(passages))
	}
	n := float64(len(passages))
	scores := make([]float64, len(passages))
	seen := map[string]bool{}
	for _, t := range q {
		if seen[t] || df[t] == 0 {
			continue
		}
		seen[t] = true
		idf := math.Log(1 + (n-float64(df[t])+0.5)/(float64(df[t])+0.5))
		for i := range passages {
			f := float64(docs[i][t])
			if f == 0 {
				continue
			}
			scores[i] += idf * f * (bm25K1 + 1) / (f + bm25K1*(1-bm25B+bm25B*float64(lens[i])/avg))
		}
	}
	order := make([]int, len(passages))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case scores[a] > scores[b]:
			return -1
		case scores[a] < scores[b]:
			return 1
		}
		return 0
	})
	return order
}

// retrievedHeader introduces the passages kept by Retrieve.
const retrievedHeader = "Context: excerpts of the earlier conversation most relevant to this request, in their original order.\n\n"

// Retrieve keeps the last message and the passages of the messages before
// it that are most relevant to it, best first, while the request fits
// limit tokens; the passages, in their original order, precede the last
// message's text in one message. ok is false when the last message alone
// does not fit.
func Retrieve(system string, msgs []Message, limit int) ([]Message, bool) {
	if len(msgs) == 0 {
		return msgs, true
	}
	last := msgs[len(msgs)-1]
	if CountMessages(system, []Message{last}) > limit {
		return msgs, false
	}
	var pool []string
	for _, m := range msgs[:len(msgs)-1] {
		pool = append(pool, Passages(m.Content, 200)...)
	}
	room := limit - CountMessages(system, []Message{last}) - CountText(retrievedHeader) - 8
	var keep []int
	for _, i := range Rank(last.Content, pool) {
		n := CountText(pool[i]) + 2
		if n > room {
			continue
		}
		keep = append(keep, i)
		room -= n
	}
	if len(keep) == 0 {
		return []Message{last}, true
	}
	slices.Sort(keep)
	var b strings.Builder
	b.WriteString(retrievedHeader)
	for _, i := range keep {
		b.WriteString(pool[i])
		b.WriteString("\n\n")
	}
	b.WriteString("---\n\n")
	b.WriteString(last.Content)
	return []Message{{Role: last.Role, Content: b.String()}}, true
}

// Split cuts the last message into parts so that each request (the system
// prompt, the messages before the last that fit beside the largest part,
// and one part) fits limit tokens. Each request's last message says which
// part it holds. ok is false when no part can fit.
func Split(system string, msgs []Message, limit int) ([][]Message, bool) {
	if len(msgs) == 0 {
		return nil, false
	}
	last := msgs[len(msgs)-1]
	// Half the room for the part, so that recent context can stay beside it.
	head := msgs[:len(msgs)-1]
	partRoom := (limit - CountMessages(system, nil) - perMessage - 16) / 2
	if partRoom < 16 {
		return nil, false
	}
	parts := Passages(last.Content, partRoom)
	if len(parts) == 0 {
		return nil, false
	}
	biggest := 0
	for _, p := range parts {
		biggest = max(biggest, CountText(p)+16)
	}
	kept, ok := Truncate(TruncateOldest, system, append(slices.Clone(head), Message{Role: last.Role, Content: strings.Repeat("x ", biggest)}), limit)
	if !ok {
		return nil, false
	}
	recent := kept[:len(kept)-1]
	out := make([][]Message, len(parts))
	for i, p := range parts {
		req := slices.Clone(recent)
		req = append(req, Message{Role: last.Role, Content: partLabel(i, len(parts)) + p})
		out[i] = req
	}
	return out, true
}

func partLabel(i, n int) string {
	return "[Part " + strconv.Itoa(i+1) + " of " + strconv.Itoa(n) + " of a long input; answer for this part.]\n\n"
}

// SummaryPrompt is the system prompt of the calls that summarise cold
// context for TruncateSummarize.
const SummaryPrompt = "Summarise the following part of a conversation so that the conversation can continue without it. " +
	"Keep facts, names, numbers, decisions and open questions; leave out pleasantries. Answer with the summary only."

// Cold splits msgs for TruncateSummarize: hot is the most recent messages
// that fit half of limit beside the system prompt (at least the last one),
// cold the ones before them.
func Cold(system string, msgs []Message, limit int) (cold, hot []Message) {
	i := len(msgs) - 1
	for i > 0 && CountMessages(system, msgs[i-1:]) <= limit/2 {
		i--
	}
	return msgs[:i], msgs[i:]
}

// Transcript renders messages as text to be summarised.
func Transcript(msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(m.Content)
		b.WriteString("\n\n")
	}
	return b.String()
}

// SummaryMessage is the message that stands for the cold context.
func SummaryMessage(summary string) Message {
	return Message{Role: "user", Content: "Summary of the earlier conversation:\n\n" + summary}
}
