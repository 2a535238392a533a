// Package api defines the one error type that crosses toolgate's public
// contract: a stable ToolErrorCode string, a numeric E-code, a message and
// optional details. Every stage, executor and control endpoint reports failures
// with it, and callers match them with errors.Is against the sentinels below,
// never by message.
package api

import (
	"errors"
	"fmt"
)

// Code is a ToolErrorCode: the stable, machine-readable class of a failure.
type Code string

// The ToolErrorCode values of the public contract.
const (
	InvalidParameters   Code = "invalid_parameters"
	ToolNotFound        Code = "tool_not_found"
	ToolVersionNotFound Code = "tool_version_not_found"
	PermissionDenied    Code = "permission_denied"
	RateLimitExceeded   Code = "rate_limit_exceeded"
	IdempotencyConflict Code = "idempotency_conflict"
	ToolExecutionError  Code = "tool_execution_error"
	SandboxFailure      Code = "sandbox_failure"
	ExternalAPIError    Code = "external_api_error"
	CircuitBreakerOpen  Code = "circuit_breaker_open"
	Timeout             Code = "timeout"
	ResourceExhausted   Code = "resource_exhausted"
	// The document bridge's: a document or source that does not exist, a
	// source that cannot be reached, a version no longer served.
	DocumentNotFound        Code = "document_not_found"
	DocumentUnavailable     Code = "document_unavailable"
	DocumentVersionConflict Code = "document_version_conflict"
	CheckpointFailed        Code = "checkpoint_failed"
	ResumeFailed            Code = "resume_failed"
	StateConflict           Code = "state_conflict"
	InternalError           Code = "internal_error"
	Cancelled               Code = "cancelled"
	// InvocationNotFound: no invocation with that id is known (named like
	// the contract's tool_not_found and document_not_found).
	InvocationNotFound Code = "invocation_not_found"
)

// Error is a coded failure. It is what a ToolInvokeResponse carries in its
// error field; the numeric E-code travels in Details["e_code"] on the wire.
type Error struct {
	Code      Code
	ECode     string // "E3001"; stable, documented in docs/errors.md
	Message   string
	Retryable bool
	// Fields lists field-level problems (schema violations) when there are any.
	Fields []FieldError
	// Details carries extra machine-readable context.
	Details map[string]any
	// cause is kept for logs and errors.Unwrap; it never reaches the wire.
	cause error
}

// FieldError is one field-level problem: where in the document, and what.
type FieldError struct {
	Location string `json:"location"`
	Message  string `json:"message"`
}

// NewError returns an Error with the given code, E-code and message.
func NewError(code Code, ecode, format string, args ...any) *Error {
	return &Error{Code: code, ECode: ecode, Message: fmt.Sprintf(format, args...)}
}

// WrapError returns an Error that keeps cause for errors.Unwrap and logs.
func WrapError(cause error, code Code, ecode, format string, args ...any) *Error {
	e := NewError(code, ecode, format, args...)
	e.cause = cause
	return e
}

func (e *Error) Error() string {
	if e.ECode != "" {
		return fmt.Sprintf("%s (%s): %s", e.Code, e.ECode, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// Is matches another *Error by code and, when the target has one, by E-code,
// so errors.Is(err, api.ErrToolNotFound) works through wrapping.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return e.Code == t.Code && (t.ECode == "" || t.ECode == e.ECode)
}

// WithFields attaches field-level errors and returns e.
func (e *Error) WithFields(f []FieldError) *Error {
	e.Fields = f
	return e
}

// WithDetail sets one detail and returns e.
func (e *Error) WithDetail(key string, v any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[key] = v
	return e
}

// AsRetryable marks e as retryable and returns it.
func (e *Error) AsRetryable() *Error {
	e.Retryable = true
	return e
}

// AsError returns err as an *Error, or wraps it as internal_error when it carries no
// code, so every failure leaving toolgate has one.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var te *Error
	if errors.As(err, &te) {
		return te
	}
	return WrapError(err, InternalError, EInternal, "%v", err)
}

// Sentinels for errors.Is. They match any Error of the same code.
var (
	ErrInvalidParameters   = &Error{Code: InvalidParameters}
	ErrToolNotFound        = &Error{Code: ToolNotFound}
	ErrToolVersionNotFound = &Error{Code: ToolVersionNotFound}
	ErrPermissionDenied    = &Error{Code: PermissionDenied}
	ErrTimeout             = &Error{Code: Timeout}
	ErrToolExecution       = &Error{Code: ToolExecutionError}
	ErrInternal            = &Error{Code: InternalError}
	ErrInvocationNotFound  = &Error{Code: InvocationNotFound}
)
