package execute

import (
	"context"
	"encoding/json"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/internal/tools"
)

// Documents resolves a call's document_context before its tool runs
// (internal/documents.Bridge). pins are the versions the call is already
// held to (a redelivered or resumed run); the handoff carries the
// parameters with the documents in the manifest's documents.parameter.
// Failures are *api.Error with details.not_started.
type Documents interface {
	Resolve(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, pins []api.DocumentPin) (DocumentHandoff, error)
}

// DocumentHandoff is what resolving a document_context gave.
type DocumentHandoff struct {
	Params   json.RawMessage
	Accessed []api.DocumentAccess
	// Pins are the versions to hold the call to (version_pinning), for
	// the invocation record.
	Pins     []api.DocumentPin
	Warnings []string
}

// wantsDocuments reports whether inv's request asks for documents.
func wantsDocuments(inv *envelope.Invocation) bool {
	dc := inv.Request.DocumentContext
	return dc != nil && (len(dc.DocumentRefs) > 0 || dc.Query != "")
}

// documents resolves inv's document_context and records what was handed
// in its metadata; pins resolved for the first time are stored in the
// invocation record when keep is set, so a redelivery or resume reads the
// same versions (a checkpoint keeps them beside its state).
// The parameters with the documents are returned, not written into the
// request: the request is what audit events carry, and they record which
// documents were read, never their content.
func (x *Executor) documents(ctx context.Context, inv *envelope.Invocation, m *tools.Manifest, pins []api.DocumentPin, keep bool) (json.RawMessage, error) {
	if m.Documents == nil {
		return nil, errNoDocumentsParameter(m)
	}
	if x.Documents == nil {
		return nil, api.NewError(api.DocumentUnavailable, api.EDocUnavailable,
			"%s: the call asks for documents and this worker has no document bridge", m.Key()).WithDetail("not_started", true)
	}
	h, err := x.Documents.Resolve(ctx, inv, m, pins)
	if err != nil {
		return nil, err
	}
	if len(h.Pins) > 0 && len(pins) == 0 && keep {
		// Unpinned, a redelivery or resume could read other versions, so the
		// call ends here. It ends rather than waiting for a redelivery: this
		// one has claimed the run, and a redelivery would take the tool for
		// interrupted mid-run, which it never was.
		_, err := x.store.UpdateRecord(ctx, inv.Tenant, inv.ID, func(r *api.Record) { r.DocumentPins = h.Pins })
		if err != nil {
			return nil, api.WrapError(err, api.InternalError, api.EDocPinFailed,
				"%s: storing the pinned document versions: %v", m.Key(), err).AsRetryable().WithDetail("not_started", true)
		}
		pins = h.Pins
	}
	inv.DocumentPins = pins
	inv.Metadata.DocumentsAccessed = h.Accessed
	inv.Metadata.Warnings = append(inv.Metadata.Warnings, h.Warnings...)
	return h.Params, nil
}

// errNoDocumentsParameter refuses document_context for a tool that takes
// no documents.
func errNoDocumentsParameter(m *tools.Manifest) error {
	return api.NewError(api.InvalidParameters, api.ERequestInvalid,
		"%s takes no documents (its manifest declares no documents parameter); leave document_context out", m.Key()).
		WithDetail("not_started", true).WithDetail("field", "document_context")
}
