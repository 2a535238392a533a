package runner

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestTakeByPriority: the highest waiting priority goes first, the lowest
// on every starveEvery-th take; a take that waits gets whichever arrives,
// on any of two, three or more feeds, and ends with ctx.
func TestTakeByPriority(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		feeds := make([]chan jetstream.Msg, n)
		for i := range feeds {
			feeds[i] = make(chan jetstream.Msg, 2)
		}
		msgs := make([]*heldMsg, n)
		for i := range msgs {
			msgs[i] = &heldMsg{}
			feeds[i] <- msgs[i]
		}
		ctx, cancel := context.WithCancel(context.Background())
		if m, ok := takeByPriority(ctx, feeds, 0); !ok || m != msgs[0] {
			t.Fatalf("%d feeds: took %v, want the highest priority's", n, m)
		}
		if m, ok := takeByPriority(ctx, feeds, starveEvery-1); !ok || m != msgs[n-1] {
			t.Fatalf("%d feeds: the starving take took %v, want the lowest priority's", n, m)
		}
		for i := 1; i < n-1; i++ {
			<-feeds[i]
		}
		late := &heldMsg{}
		go func() {
			time.Sleep(10 * time.Millisecond)
			feeds[n-1] <- late
		}()
		if m, ok := takeByPriority(ctx, feeds, 1); !ok || m != late {
			t.Fatalf("%d feeds: a waiting take got %v, want what arrived", n, m)
		}
		go func() {
			time.Sleep(10 * time.Millisecond)
			cancel()
		}()
		if m, ok := takeByPriority(ctx, feeds, 2); ok {
			t.Fatalf("%d feeds: took %v after ctx ended", n, m)
		}
	}
}
