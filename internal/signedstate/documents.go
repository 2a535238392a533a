package signedstate

import (
	"errors"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/kvstore"
	"github.com/toolgate/toolgate/subjects"
)

// DocSource checks a stored document source: signed by an operator on the
// docs source add endpoint, by the operator it names, for exactly its
// source document under its name.
func DocSource(rec kvstore.DocSourceRecord, name string, verify Verify) error {
	var r api.DocSourceRequest
	if err := signedRequest(rec.Proof, subjects.SvcDocsSourceAdd, rec.By, verify, &r); err != nil {
		return err
	}
	if rec.Name != name || !sameDoc(r.Source, rec.Source) {
		return errors.New("the stored document source is not the one the operator added")
	}
	return nil
}
