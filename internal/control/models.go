package control

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
)

// modelStats answers models.stats: the cluster-wide model statistics,
// filtered by model and task type, per task type or merged per model.
func (h *handlers) modelStats(req micro.Request) {
	var r api.ModelStatsRequest
	if len(req.Data()) > 0 {
		if err := decode(req.Data(), &r); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid,
				`expected {"model"?, "task_type"?, "by_model"?}: %v`, err))
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	all, err := h.store.ModelStats(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	_ = req.RespondJSON(modelStatsResponse(all, r, h.store.ModelStatsTTL()))
}

// modelStatsResponse filters and groups merged statistics.
func modelStatsResponse(all map[kvstore.ModelTask]kvstore.ModelShard, r api.ModelStatsRequest, ttl time.Duration) api.ModelStatsResponse {
	out := api.ModelStatsResponse{Models: []api.ModelStats{}, WindowSeconds: int64(ttl / time.Second)}
	grouped := map[kvstore.ModelTask]kvstore.ModelShard{}
	for mt, s := range all {
		if (r.Model != "" && r.Model != mt.Model) || (r.TaskType != "" && r.TaskType != mt.TaskType) {
			continue
		}
		if r.ByModel {
			mt.TaskType = "*"
		}
		g := grouped[mt]
		g.Merge(s)
		grouped[mt] = g
	}
	for mt, s := range grouped {
		out.Models = append(out.Models, s.Summary(mt))
	}
	slices.SortFunc(out.Models, func(a, b api.ModelStats) int {
		return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.TaskType, b.TaskType))
	})
	return out
}
