package runner

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/toolgate/toolgate/internal/cputime"
	"github.com/toolgate/toolgate/internal/natstest"
)

// BenchmarkTake takes b.N messages from three priority consumers, as a
// stage after validate does, and acknowledges each: the cost per message
// of the Runner's source, the client and the server together.
func BenchmarkTake(b *testing.B) {
	_, js := natstest.JetStream(b)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "P", Subjects: []string{"p.>"},
		Storage: jetstream.MemoryStorage, Retention: jetstream.WorkQueuePolicy}); err != nil {
		b.Fatal(err)
	}
	consumers := make([]jetstream.Consumer, 3)
	for i := range consumers {
		c, err := js.CreateConsumer(ctx, "P", jetstream.ConsumerConfig{Durable: fmt.Sprint("c", i),
			FilterSubject: fmt.Sprint("p.", i), AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000})
		if err != nil {
			b.Fatal(err)
		}
		consumers[i] = c
	}
	data := make([]byte, 2048)
	for i := range b.N {
		if _, err := js.PublishAsync(fmt.Sprint("p.", i%3), data); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	r := &Runner{Name: "bench", JS: js, InFlight: 64, AckWait: 30 * time.Second}
	r.Log = slog.New(slog.DiscardHandler)
	cctx, cancel := context.WithCancel(ctx)
	var fetchers sync.WaitGroup
	cpu0 := cputime.Process()
	b.ResetTimer()
	next, err := r.source(cctx, consumers, &fetchers)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	left := b.N
	for w := range 4 {
		wg.Go(func() {
			for n := w; ; n += 4 {
				mu.Lock()
				if left == 0 {
					mu.Unlock()
					return
				}
				left--
				mu.Unlock()
				m, ok := next(n)
				if !ok {
					return
				}
				_ = m.Ack()
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
	cancel()
	fetchers.Wait()
}
