package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/relay"
)

// benchSink returns a started sink with linger into a fresh in-memory
// kfake cluster whose topic bench has 10 partitions, and the function
// that closes both (each run of a benchmark function closes its own).
func benchSink(b *testing.B, linger time.Duration) (*kafka.Sink, func()) {
	b.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(10, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	s, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs(), Linger: linger, Logger: quiet})
	if err != nil {
		c.Close()
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx, relay.Session{}); err != nil {
		c.Close()
		b.Fatal(err)
	}
	return s, func() {
		s.Close(ctx)
		c.Close()
	}
}

// variant is one way of publishing that a publish benchmark compares.
type variant struct {
	name      string
	linger    time.Duration
	pipelined bool
}

// eachVariant runs bench as a sub-benchmark of each variant, on a sink of
// its own (benchSink).
func eachVariant(b *testing.B, variants []variant, bench func(b *testing.B, s *kafka.Sink, v variant)) {
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			s, stop := benchSink(b, v.linger)
			defer stop()
			bench(b, s, v)
		})
	}
}

// waiter waits, in order, for each publish put in queue, with up to three
// queued behind the one it waits for (the core keeps four in flight); done
// reports the first error, or nil once queue is closed and every publish
// in it succeeded.
func waiter() (queue chan<- func() (relay.PublishResult, error), done <-chan error) {
	q := make(chan func() (relay.PublishResult, error), 3)
	d := make(chan error, 1)
	go func() {
		for wait := range q {
			if _, err := wait(); err != nil {
				d <- err
				return
			}
		}
		d <- nil
	}()
	return q, d
}

// BenchmarkPublishLatency publishes batches of 10 events every 2 ms (5,000
// events/s) into an in-memory kfake cluster, up to four batches in flight
// as the core keeps them, and reports the p50 and p99 of the time from a
// batch's hand-over to its acknowledgement; "sequential" is Publish, one
// batch at a time. Compare the variants within one run.
func BenchmarkPublishLatency(b *testing.B) {
	eachVariant(b, []variant{
		{"sequential-linger5ms", 5 * time.Millisecond, false},
		{"pipelined-linger5ms", 5 * time.Millisecond, true},
		{"pipelined-linger0", 0, true},
	}, func(b *testing.B, s *kafka.Sink, v variant) {
		ctx := context.Background()
		var lat []time.Duration // appended to by the waiter only
		queue, done := waiter()
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			<-tick.C
			at := time.Now()
			wait := benchPublish(ctx, b, s, v.pipelined, i, 10)
			queue <- func() (relay.PublishResult, error) {
				res, err := wait()
				lat = append(lat, time.Since(at))
				return res, err
			}
		}
		close(queue)
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
	})
}

// BenchmarkPublishThroughput publishes batches of 1,000 events as fast as
// the sink takes them, up to four in flight, into an in-memory kfake
// cluster; events/s compares the variants within one run.
func BenchmarkPublishThroughput(b *testing.B) {
	eachVariant(b, []variant{
		{"sequential-linger5ms", 5 * time.Millisecond, false},
		{"pipelined-linger0", 0, true},
		{"pipelined-linger1ms", time.Millisecond, true},
	}, func(b *testing.B, s *kafka.Sink, v variant) {
		ctx := context.Background()
		queue, done := waiter()
		b.ResetTimer()
		start := time.Now()
		for i := 0; i < b.N; i++ {
			queue <- benchPublish(ctx, b, s, v.pipelined, i, 1000)
		}
		close(queue)
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N*1000)/time.Since(start).Seconds(), "events/s")
	})
}

// benchPublish hands the sink batch i of n 200-byte events, pipelined or
// not, and returns its wait.
func benchPublish(ctx context.Context, b *testing.B, s *kafka.Sink, pipelined bool, i, n int) func() (relay.PublishResult, error) {
	msgs := make([]relay.Message, n)
	for j := range msgs {
		id := fmt.Sprint(i*n + j)
		msgs[j] = msg("bench", []byte("key-"+id), make([]byte, 200), id)
	}
	if pipelined {
		wait, err := s.PublishAsync(ctx, msgs)
		if err != nil {
			b.Fatal(err)
		}
		return wait
	}
	res, err := s.Publish(ctx, msgs)
	if err != nil {
		b.Fatal(err)
	}
	return func() (relay.PublishResult, error) { return res, nil }
}
