package main

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
)

// TestSiteLine: a call waiting for its site says which site, and why.
func TestSiteLine(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		rec  api.Record
		want string
	}{
		{api.Record{Status: api.StatusPending, Site: &api.SiteWait{Site: "lab-eu", Link: "down", LastContact: &since}},
			"pending: waiting for site lab-eu, link down since 2026-01-02T03:04:05Z"},
		{api.Record{Status: api.StatusPending, Site: &api.SiteWait{Site: "lab-eu", Link: "down"}},
			"pending: waiting for site lab-eu, link down (never connected)"},
		{api.Record{Status: api.StatusPending, Site: &api.SiteWait{Site: "lab-eu", Link: "up", Queued: 3}},
			"pending: waiting for site lab-eu (link up, 3 calls queued for it)"},
		{api.Record{Status: api.StatusRunning, Site: &api.SiteWait{Site: "lab-eu", Link: "up"}}, "running at site lab-eu"},
		{api.Record{Status: api.StatusSuccess, Site: &api.SiteWait{Site: "lab-eu"}}, ""},
		{api.Record{Status: api.StatusPending}, ""},
	} {
		if got := siteLine(c.rec); got != c.want {
			t.Errorf("%+v: %q, want %q", c.rec.Site, got, c.want)
		}
	}
}
