package modelrouter

import (
	"fmt"
	"strings"
	"testing"
)

func TestPassagesFitAndKeepTheText(t *testing.T) {
	text := strings.Repeat("Alpha beta gamma. Delta epsilon zeta! ", 60) + "\n\n" +
		strings.Repeat("x", 3000) + "\n\nshort tail"
	for _, max := range []int{5, 40, 300} {
		ps := Passages(text, max)
		for i, p := range ps {
			if n := CountText(p); n > max {
				t.Fatalf("max %d: passage %d has %d tokens", max, i, n)
			}
		}
		got := strings.Join(strings.Fields(strings.ReplaceAll(strings.Join(ps, " "), " ", "")), "")
		want := strings.Join(strings.Fields(strings.ReplaceAll(text, " ", "")), "")
		if got != want {
			t.Fatalf("max %d: the passages do not give back the text", max)
		}
	}
}

// TestRank: the passage sharing the query's rare term wins over one that
// repeats a term every passage has (idf), and a long passage mentioning the
// term once loses to a short one (length normalisation).
func TestRank(t *testing.T) {
	ps := []string{
		"the report the report the report the report",
		"the invoice number is 4711",
		"the invoice " + strings.Repeat("filler words here ", 40),
		"nothing relevant in the end",
	}
	order := Rank("what is the invoice number", ps)
	if order[0] != 1 || order[1] != 2 || order[len(order)-1] == 1 {
		t.Fatalf("order %v", order)
	}
}

func TestRetrieveKeepsWhatTheQuestionNeeds(t *testing.T) {
	var msgs []Message
	for i := range 40 {
		msgs = append(msgs, Message{Role: "user", Content: fmt.Sprintf("Note %d: %s", i, strings.Repeat("the weather was mild and nothing happened. ", 20))})
	}
	msgs[17].Content += "\n\nThe vault code is 88123 and it opens the north door."
	msgs = append(msgs, Message{Role: "user", Content: "Which code opens the north vault door?"})
	out, ok := Retrieve("be brief", msgs, 400)
	if !ok || len(out) != 1 {
		t.Fatalf("ok %v, %d messages", ok, len(out))
	}
	if n := CountMessages("be brief", out); n > 400 {
		t.Fatalf("%d tokens, limit 400", n)
	}
	c := out[0].Content
	if !strings.Contains(c, "88123") || !strings.HasSuffix(c, "Which code opens the north vault door?") {
		t.Fatalf("retrieved %q", c)
	}
	if strings.Count(c, "the weather was mild") > 40 {
		t.Fatal("kept most of the irrelevant notes")
	}
	if _, ok := Retrieve("", []Message{{Role: "user", Content: strings.Repeat("word ", 1000)}}, 100); ok {
		t.Fatal("a last message larger than the limit fits")
	}
}

func TestSplit(t *testing.T) {
	long := strings.Repeat("Chapter text goes on and on. ", 400)
	msgs := []Message{{Role: "user", Content: "earlier"}, {Role: "assistant", Content: "ok"}, {Role: "user", Content: long}}
	parts, ok := Split("summarise each part", msgs, 500)
	if !ok || len(parts) < 4 {
		t.Fatalf("ok %v, %d parts", ok, len(parts))
	}
	var joined strings.Builder
	for i, p := range parts {
		if n := CountMessages("summarise each part", p); n > 500 {
			t.Fatalf("part %d: %d tokens", i, n)
		}
		last := p[len(p)-1].Content
		if !strings.HasPrefix(last, fmt.Sprintf("[Part %d of %d", i+1, len(parts))) || p[0].Content != "earlier" {
			t.Fatalf("part %d: %q…", i, last[:40])
		}
		joined.WriteString(last[strings.Index(last, "]\n\n")+3:] + " ")
	}
	if strings.Join(strings.Fields(joined.String()), " ") != strings.Join(strings.Fields(long), " ") {
		t.Fatal("the parts do not hold the whole message")
	}
}

func TestCold(t *testing.T) {
	var msgs []Message
	for i := range 20 {
		msgs = append(msgs, Message{Role: "user", Content: fmt.Sprintf("m%d %s", i, strings.Repeat("w ", 30))})
	}
	cold, hot := Cold("", msgs, 300)
	if len(cold)+len(hot) != 20 || len(hot) == 0 || len(cold) == 0 || CountMessages("", hot) > 150 {
		t.Fatalf("cold %d hot %d (%d tokens)", len(cold), len(hot), CountMessages("", hot))
	}
	if hot[len(hot)-1].Content != msgs[19].Content {
		t.Fatal("the last message is not hot")
	}
}
