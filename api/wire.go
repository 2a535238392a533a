package api

import "encoding/json"

// wire is the ToolError of the public contract.
type wire struct {
	Code      Code           `json:"code"`
	Message   string         `json:"message"`
	Details   map[string]any `json:"details,omitempty"`
	Retryable bool           `json:"retryable"`
}

// MarshalJSON writes the contract's ToolError: E-code and field errors travel
// inside details.
func (e *Error) MarshalJSON() ([]byte, error) {
	w := wire{Code: e.Code, Message: e.Message, Retryable: e.Retryable}
	if e.ECode != "" || len(e.Fields) > 0 || len(e.Details) > 0 {
		w.Details = make(map[string]any, len(e.Details)+2)
		for k, v := range e.Details {
			w.Details[k] = v
		}
		if e.ECode != "" {
			w.Details["e_code"] = e.ECode
		}
		if len(e.Fields) > 0 {
			w.Details["fields"] = e.Fields
		}
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads the contract's ToolError back into an Error.
func (e *Error) UnmarshalJSON(b []byte) error {
	var w struct {
		wire
		Details struct {
			ECode  string       `json:"e_code"`
			Fields []FieldError `json:"fields"`
		} `json:"details"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	var rest struct {
		Details map[string]any `json:"details"`
	}
	_ = json.Unmarshal(b, &rest)
	delete(rest.Details, "e_code")
	delete(rest.Details, "fields")
	if len(rest.Details) == 0 {
		rest.Details = nil
	}
	*e = Error{Code: w.Code, ECode: w.Details.ECode, Message: w.Message, Retryable: w.Retryable,
		Fields: w.Details.Fields, Details: rest.Details}
	return nil
}
