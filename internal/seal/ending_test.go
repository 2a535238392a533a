package seal

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/busauth"
	"github.com/toolgate/toolgate/internal/envelope"
	"github.com/toolgate/toolgate/subjects"
)

// TestEnding: audit takes an ending only from a role that may end that
// call, in a process of its own (as a stage host apart from authorize's
// and audit's would be): custody made for a stage by the process of the
// stage that hands it its calls verifies in audit's for that stage alone;
// no other role's process can make one, and one made for another stage,
// call, tenant or sequence does not verify.
func TestEnding(t *testing.T) {
	priv, pubs := roleKeys(t)
	host := func(r busauth.Role) (*Messages, *Signer) {
		m := NewMessages(pubs.keys)
		return m, m.NewSigner(r, priv[r])
	}
	_, authorize := host(busauth.RoleAuthorize)
	audit, _ := host(busauth.RoleAudit)
	_, route := host(busauth.RoleRoute)
	_, execute := host(busauth.RoleExecute)
	makers := map[busauth.Role]*Signer{busauth.RoleRoute: authorize, busauth.RoleControl: authorize,
		busauth.RoleExecute: route, busauth.RoleVerify: execute}
	for _, c := range []struct {
		by     *Signer
		holder busauth.Role
	}{{execute, busauth.RoleExecute}, {route, busauth.RoleVerify}, {authorize, busauth.RoleExecute}, {execute, busauth.RoleAudit},
		{NewSigner(busauth.RoleAuthorize, priv[busauth.RoleAuthorize]), busauth.RoleRoute}} {
		if got := c.by.Custody(c.holder, "acme", "x", 1); got != "" {
			t.Fatalf("%s made %s's custody: %q", c.by.role, c.holder, got)
		}
	}
	// heldBy: the custody holder was handed.
	heldBy := func(holder busauth.Role) func(*envelope.Invocation) {
		return func(inv *envelope.Invocation) {
			inv.Custody = makers[holder].Custody(holder, inv.Tenant, inv.ID, inv.Event.Seq)
		}
	}
	ended := func(stage string, e error) func(*envelope.Invocation) {
		return func(inv *envelope.Invocation) { inv.Fail(stage, e) }
	}
	failed := api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "x")
	denied := api.NewError(api.PermissionDenied, api.EApprovalDenied, "x")
	cases := []struct {
		name   string
		sender busauth.Role
		end    func(*envelope.Invocation)
		keep   func(*envelope.Invocation) // what is done to it after authorize
		ok     bool
	}{
		{"validate's refusal", busauth.RoleValidate, ended(subjects.Validate, failed), nil, true},
		{"authorize's refusal", busauth.RoleAuthorize, ended(subjects.Authorize, denied), nil, true},
		{"validate ends as execute", busauth.RoleValidate, ended(subjects.Execute, failed), nil, false},
		{"authorize with a success", busauth.RoleAuthorize, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Authorize, json.RawMessage(`{}`))
		}, nil, false},
		{"route's refusal of a call it held", busauth.RoleRoute, ended(subjects.Route, failed), heldBy(busauth.RoleRoute), true},
		{"route with a success", busauth.RoleRoute, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Route, json.RawMessage(`{}`))
		}, heldBy(busauth.RoleRoute), false},
		{"execute's failure of a call it held", busauth.RoleExecute, ended(subjects.Execute, failed), heldBy(busauth.RoleExecute), true},
		{"execute's replayed success", busauth.RoleExecute, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Execute, json.RawMessage(`{}`))
		}, heldBy(busauth.RoleExecute), true},
		{"verify's success of a call it held", busauth.RoleVerify, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Verify, json.RawMessage(`{}`))
		}, heldBy(busauth.RoleVerify), true},
		{"execute ends a call it never held", busauth.RoleExecute, ended(subjects.Execute, failed), nil, false},
		{"execute ends as verify", busauth.RoleExecute, ended(subjects.Verify, failed), heldBy(busauth.RoleVerify), false},
		{"execute ends as validate", busauth.RoleExecute, ended(subjects.Validate, failed), heldBy(busauth.RoleExecute), false},
		{"execute with another call's custody", busauth.RoleExecute, ended(subjects.Execute, failed), func(inv *envelope.Invocation) {
			inv.Custody = route.Custody(busauth.RoleExecute, inv.Tenant, inv.ID+"-other", inv.Event.Seq)
		}, false},
		{"execute with another sequence's custody", busauth.RoleExecute, ended(subjects.Execute, failed), func(inv *envelope.Invocation) {
			inv.Custody = route.Custody(busauth.RoleExecute, inv.Tenant, inv.ID, inv.Event.Seq+1)
		}, false},
		{"execute with another tenant's custody", busauth.RoleExecute, ended(subjects.Execute, failed), func(inv *envelope.Invocation) {
			inv.Custody = route.Custody(busauth.RoleExecute, "other", inv.ID, inv.Event.Seq)
		}, false},
		{"control denies a parked call", busauth.RoleControl, ended(subjects.Authorize, denied), heldBy(busauth.RoleControl), true},
		{"control cancels a parked call", busauth.RoleControl, ended(subjects.Authorize,
			api.NewError(api.Cancelled, api.ECancelled, "x")), heldBy(busauth.RoleControl), true},
		{"control denies a call never parked", busauth.RoleControl, ended(subjects.Authorize, denied), nil, false},
		{"control fails a parked call otherwise", busauth.RoleControl, ended(subjects.Authorize, failed), heldBy(busauth.RoleControl), false},
		{"control ends as control", busauth.RoleControl, ended("control", denied), heldBy(busauth.RoleControl), false},
		{"audit hands itself an ending", busauth.RoleAudit, ended(subjects.Audit, failed), heldBy(busauth.RoleVerify), false},
		// Every stage may read the pipeline stream: a custody copied
		// from a hop to another stage ends nothing.
		{"verify with the custody of the hop to execute", busauth.RoleVerify, func(inv *envelope.Invocation) {
			inv.Succeed(subjects.Verify, json.RawMessage(`{}`))
		}, heldBy(busauth.RoleExecute), false},
		{"execute with the custody of the hop to route", busauth.RoleExecute, ended(subjects.Execute, failed), heldBy(busauth.RoleRoute), false},
		{"route with the custody of the hop to execute", busauth.RoleRoute, ended(subjects.Route, failed), heldBy(busauth.RoleExecute), false},
		{"control cancels with the custody of the hop to route", busauth.RoleControl, ended(subjects.Authorize,
			api.NewError(api.Cancelled, api.ECancelled, "x")), heldBy(busauth.RoleRoute), false},
		{"execute with verify's custody it made itself", busauth.RoleExecute, ended(subjects.Execute, failed), heldBy(busauth.RoleVerify), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inv := &envelope.Invocation{ID: "inv-1", Tenant: "acme", Event: envelope.Event{Seq: 7}, Status: api.StatusPending}
			if tc.keep != nil {
				tc.keep(inv)
			}
			tc.end(inv)
			err := audit.Ending(tc.sender, inv)
			if tc.ok != (err == nil) {
				t.Fatalf("Ending: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, &api.Error{Code: api.PermissionDenied, ECode: api.EEndingRefused}) {
				t.Fatalf("refusal %v, want permission_denied E3230", err)
			}
		})
	}
}

// BenchmarkCustody is the cost custody adds per hand-off (one MAC by the
// stage that hands the call on) and per ending (one check at audit).
func BenchmarkCustody(b *testing.B) {
	priv, pubs := roleKeys(&testing.T{})
	m := NewMessages(pubs.keys)
	route := m.NewSigner(busauth.RoleRoute, priv[busauth.RoleRoute])
	m.NewSigner(busauth.RoleAudit, priv[busauth.RoleAudit])
	inv := &envelope.Invocation{ID: "0f8fad5b-d9cb-469f-a165-70867728950e", Tenant: "acme", Event: envelope.Event{Seq: 123456}}
	inv.Fail(subjects.Execute, api.NewError(api.ToolExecutionError, api.EOutcomeUnknown, "x"))
	b.ReportAllocs()
	for b.Loop() {
		inv.Custody = route.Custody(busauth.RoleExecute, inv.Tenant, inv.ID, inv.Event.Seq)
		if err := m.Ending(busauth.RoleExecute, inv); err != nil {
			b.Fatal(err)
		}
	}
}
