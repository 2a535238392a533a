package stages

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestAnnounceAfter: an event is announced once the stage has worked past
// the grace, and otherwise left to the stage; never both.
func TestAnnounceAfter(t *testing.T) {
	out := Output{Subject: "audit.acme.tool.invoked", MsgID: "1.a.audit.tool.invoked"}
	announcer := func(fail error) (context.Context, *atomic.Int32) {
		var n atomic.Int32
		return WithAnnounce(context.Background(), func(_ context.Context, o Output) error {
			if o.MsgID != out.MsgID {
				t.Errorf("announced %q", o.MsgID)
			}
			n.Add(1)
			return fail
		}), &n
	}

	ctx, n := announcer(nil)
	p := AnnounceAfter(ctx, time.Hour, out)
	if !p.Withdraw() || n.Load() != 0 {
		t.Fatalf("work done within the grace: carry %v after %d announcements, want true after 0", !p.Withdraw(), n.Load())
	}

	ctx, n = announcer(nil)
	p = AnnounceAfter(ctx, time.Millisecond, out)
	for n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if p.Withdraw() || n.Load() != 1 {
		t.Fatalf("work past the grace: carry %v after %d announcements, want false after 1", !p.Withdraw(), n.Load())
	}

	ctx, n = announcer(errors.New("bus down"))
	p = AnnounceAfter(ctx, time.Millisecond, out)
	for n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if !p.Withdraw() {
		t.Fatal("a failed announcement left the stage nothing to carry")
	}

	p = AnnounceAfter(context.Background(), time.Millisecond, out) // no Runner
	time.Sleep(5 * time.Millisecond)
	if !p.Withdraw() {
		t.Fatal("without a Runner the stage must carry the event")
	}
}

// TestAnnounceAfterRace: whenever Withdraw comes, exactly one of the two
// delivers the event (under -race).
func TestAnnounceAfterRace(t *testing.T) {
	for i := range 200 {
		var n atomic.Int32
		ctx := WithAnnounce(context.Background(), func(context.Context, Output) error { n.Add(1); return nil })
		p := AnnounceAfter(ctx, time.Duration(i%5)*50*time.Microsecond, Output{})
		time.Sleep(time.Duration(i%7) * 30 * time.Microsecond)
		carried := p.Withdraw()
		time.Sleep(300 * time.Microsecond) // a timer that fired late must not announce now
		if delivered := n.Load() + map[bool]int32{true: 1}[carried]; delivered != 1 {
			t.Fatalf("round %d: delivered %d times", i, delivered)
		}
	}
}
