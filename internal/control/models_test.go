package control

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/modelrouter"
	"github.com/toolgate/toolgate/kvstore"
)

// TestModelStatsResponse: the filters keep the model and task type asked
// for, by_model merges a model's task types, and the rows are sorted.
func TestModelStatsResponse(t *testing.T) {
	shard := func(n int, failure string) kvstore.ModelShard {
		var s kvstore.ModelShard
		for range n {
			s.Add(modelrouter.Outcome{Failure: failure, LatencyMS: 100, Cost: 1}, time.Unix(1e9, 0))
		}
		return s
	}
	all := map[kvstore.ModelTask]kvstore.ModelShard{
		{Model: "b", TaskType: "coding"}:   shard(3, ""),
		{Model: "a", TaskType: "research"}: shard(1, modelrouter.FailTimeout),
		{Model: "a", TaskType: "coding"}:   shard(2, ""),
	}
	rows := func(r api.ModelStatsRequest) string {
		out := modelStatsResponse(all, r, time.Hour)
		if out.WindowSeconds != 3600 {
			t.Fatalf("window %d", out.WindowSeconds)
		}
		s := ""
		for _, m := range out.Models {
			s += m.Model + "/" + m.TaskType + ":" + string(rune('0'+m.Calls)) + " "
		}
		return s
	}
	for _, c := range []struct {
		req  api.ModelStatsRequest
		want string
	}{
		{api.ModelStatsRequest{}, "a/coding:2 a/research:1 b/coding:3 "},
		{api.ModelStatsRequest{Model: "a"}, "a/coding:2 a/research:1 "},
		{api.ModelStatsRequest{TaskType: "coding"}, "a/coding:2 b/coding:3 "},
		{api.ModelStatsRequest{ByModel: true}, "a/*:3 b/*:3 "},
		{api.ModelStatsRequest{Model: "c"}, ""},
	} {
		if got := rows(c.req); got != c.want {
			t.Errorf("%+v: %q, want %q", c.req, got, c.want)
		}
	}
	byModel := modelStatsResponse(all, api.ModelStatsRequest{Model: "a", ByModel: true}, time.Hour).Models[0]
	if byModel.Failures[modelrouter.FailTimeout] != 1 || byModel.Successes != 2 || byModel.Cost != 3 {
		t.Fatalf("a merged: %+v", byModel)
	}
}
