package bench

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// ProfileShares is where the serve process's CPU went per call, read from
// its CPU profile: unlike the process's CPU beside the floor's, the stages'
// own share does not move with the disk's fsync time, so it shows a change
// of tens of microseconds between builds.
type ProfileShares struct {
	Total  time.Duration // all of serve's CPU in the profile
	Stages time.Duration // under the stage runners, their settling goroutines too: the stages' code and what it calls
	Sign   time.Duration // of which Ed25519 signing
	JSON   time.Duration // of which encoding/json and the faster decoders (goccy/go-json, segmentio/encoding/json)
	Server time.Duration // in nats-server's code, the floor's share among it
	// Kernel is serve's CPU per call over the profile's window as
	// /proc counts it (user and system time), the measure goal 4 uses:
	// beside Total it shows how much of that measure the profile sees.
	Kernel time.Duration
}

// profileCategories name a sample by the functions on its stack.
var profileCategories = []struct {
	prefix string
	field  func(*ProfileShares) *time.Duration
}{
	{"github.com/toolgate/toolgate/internal/runner.(*Runner).", func(p *ProfileShares) *time.Duration { return &p.Stages }},
	{"crypto/ed25519.Sign", func(p *ProfileShares) *time.Duration { return &p.Sign }},
	{"encoding/json.", func(p *ProfileShares) *time.Duration { return &p.JSON }},
	{"github.com/goccy/go-json.", func(p *ProfileShares) *time.Duration { return &p.JSON }},
	{"github.com/segmentio/encoding/json.", func(p *ProfileShares) *time.Duration { return &p.JSON }},
	{"github.com/nats-io/nats-server/v2/server.", func(p *ProfileShares) *time.Duration { return &p.Server }},
}

// profileShares reads a CPU profile (pprof's format) and divides each
// share by calls.
func profileShares(b []byte, calls int) (ProfileShares, error) {
	var s ProfileShares
	p, err := profile.Parse(bytes.NewReader(b))
	if err != nil {
		return s, err
	}
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			cpu = i
		}
	}
	if cpu < 0 || calls <= 0 {
		return s, fmt.Errorf("not a CPU profile of calls")
	}
	var total ProfileShares
	for _, smp := range p.Sample {
		d := time.Duration(smp.Value[cpu])
		total.Total += d
		// Each share counts a sample once, however often its function
		// recurs on the stack; a sample under the runners that signs
		// counts in Stages and in Sign.
		seen := make(map[*time.Duration]bool, len(profileCategories))
		for _, loc := range smp.Location {
			for _, line := range loc.Line {
				if line.Function == nil {
					continue
				}
				for _, c := range profileCategories {
					f := c.field(&total)
					if !seen[f] && strings.HasPrefix(line.Function.Name, c.prefix) {
						seen[f] = true
						*f += d
					}
				}
			}
		}
	}
	n := time.Duration(calls)
	return ProfileShares{Total: total.Total / n, Stages: total.Stages / n, Sign: total.Sign / n, JSON: total.JSON / n, Server: total.Server / n}, nil
}

// mergeProfiles is one profile (pprof's format) of the windows in parts,
// each a profile of the same process: its samples are theirs, summed.
func mergeProfiles(parts [][]byte) ([]byte, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("no profile taken")
	}
	ps := make([]*profile.Profile, len(parts))
	for i, b := range parts {
		p, err := profile.Parse(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	merged, err := profile.Merge(ps)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := merged.Write(&out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// allocsPath is where the allocations beside the CPU profile at path are
// written.
func allocsPath(path string) string { return withSuffix(path, "-allocs") }

// profileDelta is after less before, two profiles of one process (pprof's
// format; an allocs profile counts from the process's start): what it
// did between them, as `go tool pprof -base` reads it.
func profileDelta(before, after []byte) ([]byte, error) {
	b, err := profile.Parse(bytes.NewReader(before))
	if err != nil {
		return nil, err
	}
	a, err := profile.Parse(bytes.NewReader(after))
	if err != nil {
		return nil, err
	}
	b.Scale(-1)
	d, err := profile.Merge([]*profile.Profile{a, b})
	if err != nil {
		return nil, err
	}
	// Stacks that did nothing in between net to zero: left out.
	kept := d.Sample[:0]
	for _, smp := range d.Sample {
		for _, v := range smp.Value {
			if v != 0 {
				kept = append(kept, smp)
				break
			}
		}
	}
	d.Sample = kept
	var out bytes.Buffer
	if err := d.Write(&out); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
