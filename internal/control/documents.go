package control

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/documents"
	"github.com/toolgate/toolgate/kvstore"
)

// docSourceStore is what the document source endpoints read and write
// (*kvstore.Store).
type docSourceStore interface {
	PutDocSource(ctx context.Context, name string, doc json.RawMessage, by string, proof *api.DecisionProof) (uint64, error)
	DocSources(ctx context.Context) ([]kvstore.DocSourceRecord, error)
	DeleteDocSource(ctx context.Context, name string) error
}

var _ docSourceStore = (*kvstore.Store)(nil)

// addDocSource checks a source document and declares (or replaces) it.
func (h *handlers) addDocSource(req micro.Request) {
	var r api.DocSourceRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"source":{…}}`)
	if !ok {
		return
	}
	src, err := documents.Decode(r.Source)
	if err != nil {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, "%v", err))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	if _, err := h.admin.PutDocSource(ctx, src.Name, r.Source, who, h.proof(req)); err != nil {
		respondError(req, err)
		return
	}
	target := "stdio"
	if src.URL != "" {
		target = src.URL
	}
	h.audited(ctx, req, api.TypeDocSourceAdded,
		api.AdminChange{Action: "docs.source.add", By: who, Target: src.Name, Details: map[string]any{"server": target}}, src)
}

// listDocSources answers the declared sources' documents.
func (h *handlers) listDocSources(req micro.Request) {
	var r struct{}
	if _, ok := h.decodeAdmin(req, &r, func() string { return "" }, "{}"); !ok {
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	recs, err := h.admin.DocSources(ctx)
	if err != nil {
		respondError(req, err)
		return
	}
	out := api.DocSourcesResponse{Sources: []json.RawMessage{}}
	for _, rec := range recs {
		out.Sources = append(out.Sources, rec.Source)
	}
	_ = req.RespondJSON(out)
}

// removeDocSource removes a source; an unknown name gets E3601.
func (h *handlers) removeDocSource(req micro.Request) {
	var r api.DocSourceRequest
	who, ok := h.decodeAdmin(req, &r, func() string { return r.By }, `{"name":…}`)
	if !ok {
		return
	}
	if r.Name == "" {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid, `expected {"name":…}`))
		return
	}
	ctx, cancel := adminContext()
	defer cancel()
	err := h.admin.DeleteDocSource(ctx, r.Name)
	if errors.Is(err, kvstore.ErrDocSourceNotFound) {
		err = api.NewError(api.DocumentNotFound, api.EDocNotFound, "no document source %q is declared", r.Name)
	}
	if err != nil {
		respondError(req, err)
		return
	}
	h.audited(ctx, req, api.TypeDocSourceRemoved, api.AdminChange{Action: "docs.source.remove", By: who, Target: r.Name},
		api.DocSourceRequest{Name: r.Name})
}
