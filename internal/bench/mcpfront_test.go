package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/tools"
)

// registry is a Bus with a fixed registry and nothing behind it:
// measureFrontAlone answers every call itself.
type registry struct{ m []*tools.Manifest }

func (registry) Invoke(context.Context, api.Request, string) error { return nil }
func (registry) Wait(context.Context, string, string) (api.Response, error) {
	return api.Response{}, nil
}
func (registry) Status(context.Context, string, string) (api.Record, error) {
	return api.Record{}, nil
}
func (registry) Cancel(context.Context, string, string, string) error { return nil }
func (r registry) Tools() []*tools.Manifest                           { return r.m }
func (registry) WatchTools(context.Context, func()) error             { return nil }

// TestFrontAlone: the front end and the SDK's own server each answer
// tools/calls on both transports against the answering bus, every call
// timed, and the goal compares each transport's pair.
func TestFrontAlone(t *testing.T) {
	m, err := tools.Parse([]byte(`{"id":"noop","name":"noop","version":"1.0.0","description":"does nothing","kind":"builtin",
	  "builtin":{"function":"noop"},"input_schema":{"type":"object"}}`))
	if err != nil {
		t.Fatal(err)
	}
	cred, err := newCredentials()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	costs, err := measureFrontAlone(ctx, registry{[]*tools.Manifest{m}}, cred, 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(costs) != 4 {
		t.Fatalf("%d paths", len(costs))
	}
	for _, c := range costs {
		if len(c.Samples) != 20 || c.quantile(0.5) <= 0 {
			t.Errorf("%s: %d samples, p50 %v", c.Name, len(c.Samples), c.quantile(0.5))
		}
	}
	var b strings.Builder
	PrintFront(&b, append([]Cost{{Name: "direct tool.invoke", Samples: []time.Duration{time.Millisecond}}}, costs...))
	for _, want := range []string{"goal: front over SDK, stdio", "goal: front over SDK, HTTP", aloneFrontHTTP} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed no %q:\n%s", want, b.String())
		}
	}
}

// TestFrontGoal: the goal line reads the alone rows, not the pipeline's.
func TestFrontGoal(t *testing.T) {
	at := func(name string, d time.Duration) Cost { return Cost{Name: name, Samples: []time.Duration{d}} }
	costs := []Cost{
		at("direct tool.invoke", 3*time.Millisecond),
		// Through the pipeline the front looks 400 µs slower: noise of
		// the pipeline, not the front end's.
		at("MCP tools/call, stdio", 3900*time.Microsecond), at("floor: SDK server, stdio", 3500*time.Microsecond),
		at(aloneFrontStdio, 250*time.Microsecond), at(aloneSDKStdio, 200*time.Microsecond),
		at(aloneFrontHTTP, 450*time.Microsecond), at(aloneSDKHTTP, 300*time.Microsecond),
	}
	var b strings.Builder
	PrintFront(&b, costs)
	lines := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "goal: front over SDK, ") {
			lines[strings.Fields(l)[4]] = l
		}
	}
	if l := lines["stdio"]; !strings.Contains(l, "50.0µs") || !strings.HasSuffix(l, " met") {
		t.Errorf("stdio: %q", l)
	}
	if l := lines["HTTP"]; !strings.Contains(l, "150.0µs") || !strings.HasSuffix(l, "NOT MET") {
		t.Errorf("HTTP: %q", l)
	}
}
