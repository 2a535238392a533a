package stages

import (
	"context"
	"errors"
	"testing"
	"time"
)

// messageContext is what the Runner gives a stage for one message.
func messageContext(ctx context.Context, pub func(context.Context, Output) error) context.Context {
	return WithMessage(ctx, 2, 5, "TOOLGATE_PIPELINE", 41, 300, pub)
}

// TestMessageContextReads: every reader sees what the Runner recorded for
// the message, through contexts derived from it, and what a later
// WithDelivery, WithInput or WithAnnounce records instead.
func TestMessageContextReads(t *testing.T) {
	var announced []Output
	pub := func(_ context.Context, o Output) error { announced = append(announced, o); return nil }
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), announceKey{}, "not a publisher"))
	ctx := messageContext(parent, pub)
	derived, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	for _, c := range []context.Context{ctx, derived} {
		if d, m := Delivery(c); d != 2 || m != 5 {
			t.Fatalf("Delivery = %d, %d", d, m)
		}
		if Input(c) != "TOOLGATE_PIPELINE:41" || InputSize(c) != 300 {
			t.Fatalf("Input = %q, %d", Input(c), InputSize(c))
		}
		if err := Announce(c, Output{Subject: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if len(announced) != 2 {
		t.Fatalf("announced %d", len(announced))
	}
	again := WithDelivery(ctx, 5, 5)
	if d, _ := Delivery(again); d != 5 || Input(again) != "TOOLGATE_PIPELINE:41" || Announce(again, Output{}) != nil || len(announced) != 3 {
		t.Fatalf("WithDelivery: %d %q %d", d, Input(again), len(announced))
	}
	other := WithAnnounce(WithInput(ctx, "S", 7, 1), func(context.Context, Output) error { return errors.New("other") })
	if Input(other) != "S:7" || Announce(other, Output{}) == nil {
		t.Fatal("a later WithInput or WithAnnounce is not what readers see")
	}
	// Without a publisher the message's context leaves Announce to its parent's.
	if err := Announce(messageContext(context.Background(), nil), Output{}); !errors.Is(err, ErrNoAnnouncer) {
		t.Fatalf("Announce without a publisher: %v", err)
	}
	cancel()
	if derived.Err() == nil || ctx.Err() == nil {
		t.Fatal("cancelling the parent does not reach the message's context")
	}
	if Input(context.Background()) != "" || InputSize(context.Background()) != 0 {
		t.Fatal("outside a Runner")
	}
}

// TestMessageContextAllocations: the Runner's per-message context is one
// allocation a hop (it was three: a value for the message, its facts, a
// value for the publisher).
func TestMessageContextAllocations(t *testing.T) {
	pub := func(context.Context, Output) error { return nil }
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { messageContext(ctx, pub) }); n > 1 {
		t.Fatalf("%v allocations a message", n)
	}
}

// BenchmarkMessageContext is a hop's context for its stage, and its reads.
func BenchmarkMessageContext(b *testing.B) {
	pub := func(context.Context, Output) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		c := messageContext(ctx, pub)
		if Input(c) == "" || InputSize(c) == 0 || Announce(c, Output{}) != nil {
			b.Fatal("not recorded")
		}
	}
}
