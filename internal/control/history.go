package control

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/subjects"
)

// Audit history page sizes.
const (
	historyPageDefault = 50
	historyPageMax     = 200
	// historySkipMax bounds the events of other agents one page of an
	// agent's history reads past.
	historySkipMax = 2000
)

// historyReserve is what a page leaves of the server's maximum payload for
// the answer's own framing.
const historyReserve = 16 << 10

// tenantAuditHistory answers a page of tenant's stored audit events on
// tool.svc.<tenant>.audit.history. Agents may create no consumer (one could
// deliver anywhere), so this endpoint reads the stream for them by
// sequence, filtered to the subject's tenant; the cursor is the stream
// sequence the next page starts at.
func (h *handlers) tenantAuditHistory(tenant string, req micro.Request) {
	var r api.AuditHistoryRequest
	if len(req.Data()) > 0 {
		if err := decode(req.Data(), &r); err != nil {
			respondError(req, api.WrapError(err, api.InvalidParameters, api.ERequestInvalid,
				`bad audit history request: %v; expected {"cursor"?, "since"?, "page_size"?}`, err))
			return
		}
	}
	if !sameTenant(req, tenant, &r.TenantID) {
		return
	}
	size := r.PageSize
	if size == 0 {
		size = historyPageDefault
	}
	if size < 0 || size > historyPageMax {
		respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid,
			"page_size %d: it must be 1 to %d", r.PageSize, historyPageMax))
		return
	}
	var start uint64
	if r.Cursor != "" {
		n, err := strconv.ParseUint(r.Cursor, 10, 64)
		if err != nil || n == 0 {
			respondError(req, api.NewError(api.InvalidParameters, api.ERequestInvalid,
				"cursor %q is not one this endpoint gave", r.Cursor))
			return
		}
		start = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	page, err := h.auditPage(ctx, tenant, viewerOf(req), start, r.Since, size, h.nc.MaxPayload()-historyReserve)
	if err != nil {
		respondError(req, api.WrapError(err, api.InternalError, api.EInternal, "reading the audit trail: %v", err))
		return
	}
	_ = req.RespondJSON(page)
}

// auditPage reads up to size events of tenant that v may see from sequence
// start (0: from since, or the first stored), at most budget bytes of them
// but always one. An agent sees the events whose data names it
// (agent_did); events that name no agent are for those who see all.
func (h *handlers) auditPage(ctx context.Context, tenant string, v viewer, start uint64, since *time.Time, size int, budget int64) (api.AuditHistoryResponse, error) {
	out := api.AuditHistoryResponse{Events: []api.AuditEntry{}}
	st, err := h.js.Stream(ctx, subjects.StreamAudit)
	if err != nil {
		return out, err
	}
	state := st.CachedInfo().State
	if start == 0 {
		start = state.FirstSeq
		if since != nil {
			if start, err = firstAtOrAfter(ctx, st, state.FirstSeq, state.LastSeq, *since); err != nil {
				return out, err
			}
		}
	}
	filter := subjects.AuditTenant(tenant)
	seq, used, skipped := start, int64(0), 0
	for {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return out, err
		}
		if !v.all && !v.sees(auditAgent(m.Data)) {
			// Others' events are skipped, a bounded number a page: the
			// cursor then resumes after them.
			seq = m.Sequence + 1
			if skipped++; skipped >= historySkipMax {
				out.More = true
				break
			}
			continue
		}
		cost := int64(len(m.Data) + len(m.Subject) + 64)
		if len(out.Events) == size || (len(out.Events) > 0 && used+cost > budget) {
			out.More = true
			break
		}
		used += cost
		out.Events = append(out.Events, api.AuditEntry{Subject: m.Subject, Time: m.Time.UTC(), Event: asJSON(m.Data)})
		seq = m.Sequence + 1
	}
	// At the end, the next page starts after what the stream holds now, so
	// that asking again answers only what was stored since.
	if !out.More {
		seq = max(seq, state.LastSeq+1)
	}
	out.NextCursor = strconv.FormatUint(max(seq, 1), 10)
	return out, nil
}

// firstAtOrAfter finds the first sequence in [first, last] stored at or
// after t (last+1 when none is): the stream stores in time order, so a
// binary search over sequences, each probe the next message at or after
// its sequence, as sequences may have gaps.
func firstAtOrAfter(ctx context.Context, st jetstream.Stream, first, last uint64, t time.Time) (uint64, error) {
	lo, hi := first, last+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		m, err := st.GetMsg(ctx, mid, jetstream.WithGetMsgSubject(subjects.AuditAll))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			hi = mid
			continue
		}
		if err != nil {
			return 0, err
		}
		if m.Time.Before(t) {
			lo = m.Sequence + 1
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// asJSON is data itself when it is JSON, else data as a JSON string (an
// event nothing could read is audited as it came).
func asJSON(data []byte) json.RawMessage {
	if json.Valid(data) {
		return data
	}
	b, _ := json.Marshal(string(data))
	return b
}
