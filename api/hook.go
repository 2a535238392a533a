package api

// Link ties an invocation a hook started (a retry or a fallback) to the one
// whose outcome fired the hook. toolgate's audit stage sets it when it
// publishes the new tool.invoke event; authorize admits such a request only
// when the parent's recorded hook decision names exactly this invocation,
// tool, version and parameters.
type Link struct {
	// Parent is the invocation whose outcome fired the hook.
	Parent string `json:"parent"`
	// Root is the first invocation of the chain.
	Root string `json:"root"`
	// Hook names the hook that started this invocation, and Action what it
	// did (retry or retry_with_fallback).
	Hook   string `json:"hook"`
	Action string `json:"action"`
	// Depth is how many hooks separate this invocation from Root (1 for a
	// root's retry); Attempt counts consecutive invocations the same hook
	// started along the chain.
	Depth   int `json:"depth"`
	Attempt int `json:"attempt"`
}

// HookOutcome is what a hook decided about an ended invocation, in its
// execution metadata.
type HookOutcome struct {
	// Hook is the hook's name; Source is "manifest" or "tenant".
	Hook    string `json:"hook,omitempty"`
	Source  string `json:"source,omitempty"`
	Trigger string `json:"trigger,omitempty"`
	Action  string `json:"action,omitempty"`
	// HandedTo is the invocation a retry or fallback started: the caller
	// follows it for the final answer.
	HandedTo string `json:"handed_to,omitempty"`
	// Parent is set on an invocation a hook started: the invocation it
	// continues.
	Parent string `json:"parent,omitempty"`
	// SessionAborted is set when an abort hook ended the session: its
	// later calls are refused (E3802).
	SessionAborted bool `json:"session_aborted,omitempty"`
	// ConditionErrors lists conditions that failed at run time (each was
	// taken as false).
	ConditionErrors []string `json:"condition_errors,omitempty"`
}
