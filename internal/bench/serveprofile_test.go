package bench

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// TestProfileShares: each sample counts once in every share whose code is
// on its stack, however often that code recurs, and the shares are per
// call.
func TestProfileShares(t *testing.T) {
	fns := map[string]*profile.Function{}
	var locs uint64
	loc := func(names ...string) []*profile.Location {
		var out []*profile.Location
		for _, n := range names {
			f, ok := fns[n]
			if !ok {
				f = &profile.Function{ID: uint64(len(fns) + 1), Name: n}
				fns[n] = f
			}
			locs++
			out = append(out, &profile.Location{ID: locs, Line: []profile.Line{{Function: f}}})
		}
		return out
	}
	const run = "github.com/toolgate/toolgate/internal/runner.(*Runner).Run.func3"
	samples := []struct {
		ms    int64
		stack []string
	}{
		{40, []string{"crypto/internal/fips140/ed25519.Sign", "crypto/ed25519.Sign", "github.com/toolgate/toolgate/internal/seal.(*Signer).Sign", run}},
		{30, []string{"encoding/json.checkValid", "encoding/json.Valid", "encoding/json.Unmarshal", run}},
		{20, []string{"github.com/toolgate/toolgate/stages/authorize.(*Authorizer).Process", run, run}},
		{100, []string{"internal/runtime/syscall/linux.Syscall6", "github.com/nats-io/nats-server/v2/server.(*msgBlock).writeMsgRecord"}},
		{10, []string{"runtime.gcBgMarkWorker"}},
		// A goroutine the runner started to settle a message.
		{15, []string{"runtime.selectgo", "github.com/toolgate/toolgate/internal/runner.(*Runner).apply.func4", "sync.(*WaitGroup).Go.func1"}},
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: int64(10 * time.Millisecond),
	}
	for _, s := range samples {
		p.Sample = append(p.Sample, &profile.Sample{Value: []int64{s.ms / 10, s.ms * int64(time.Millisecond)}, Location: loc(s.stack...)})
	}
	for _, f := range fns {
		p.Function = append(p.Function, f)
	}
	for _, s := range p.Sample {
		p.Location = append(p.Location, s.Location...)
	}
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	got, err := profileShares(b.Bytes(), 10)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond / 10 }
	want := ProfileShares{Total: ms(215), Stages: ms(105), Sign: ms(40), JSON: ms(30), Server: ms(100)}
	if got != want {
		t.Fatalf("shares %+v, want %+v", got, want)
	}
	if _, err := profileShares([]byte("not a profile"), 10); err == nil {
		t.Fatal("a file that is no profile was read")
	}
}

// TestPrintFloorProfile: the floor chain's profile is printed whether or
// not toolgate's was read, and the difference only beside toolgate's.
func TestPrintFloorProfile(t *testing.T) {
	for _, toolgateErr := range []error{nil, errors.New("pprof: 500")} {
		s := &Shipped{Profile: "serve.prof", ProfileSeconds: 20, profileErr: toolgateErr,
			Shares:       ProfileShares{Server: 2500 * time.Microsecond},
			FloorProfile: "serve-floor.prof", FloorProfileCalls: 3000,
			FloorShares: ProfileShares{Total: 3000 * time.Microsecond, Server: 2900 * time.Microsecond}}
		var b strings.Builder
		s.Print(&b)
		out := b.String()
		if !strings.Contains(out, "floor chain's CPU profile (20 s, 3000 calls at saturation): serve-floor.prof") {
			t.Errorf("no floor profile printed:\n%s", out)
		}
		if diff := strings.Contains(out, "toolgate's less this"); diff != (toolgateErr == nil) {
			t.Errorf("difference printed %v with toolgate's profile error %v:\n%s", diff, toolgateErr, out)
		}
	}
}
