package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/sink/embedded"
	"github.com/outboxrelay/relay/relay"
)

// BenchmarkPublish publishes pages of 8,000 events of 200 bytes, waiting
// for each page as the relay does, into one topic of 8 partitions and
// spread over the 8,000 partitions of 1,000 topics, where every record is
// a batch of its own: the sink's and the broker's cost per event, without
// Postgres. An op is one event.
func BenchmarkPublish(b *testing.B) {
	for _, topics := range []int{1, 1000} {
		b.Run(fmt.Sprintf("topics=%d", topics), func(b *testing.B) {
			benchmarkPublish(b, topics)
		})
	}
}

func benchmarkPublish(b *testing.B, topics int) {
	const parts, page = 8, 8000
	s, err := embedded.New(embedded.Config{Broker: broker.Options{Dir: b.TempDir(), DefaultPartitions: parts, JanitorInterval: -1}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx, relay.Session{}); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(ctx)
	value := bytes.Repeat([]byte{'x'}, 200)
	msgs := make([]relay.Message, page)
	for i := range msgs {
		// Keys spread each topic's events over all its partitions.
		msgs[i] = relay.Message{
			Topic:     fmt.Sprintf("bench-%d", i%topics),
			Key:       fmt.Appendf(nil, "key-%d", i/topics),
			Value:     value,
			Headers:   []relay.Header{{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "%016d", i)}},
			Timestamp: time.UnixMilli(1_700_000_000_000),
		}
	}
	publish := func(msgs []relay.Message) {
		wait, err := s.PublishAsync(ctx, msgs)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := wait(); err != nil {
			b.Fatal(err)
		}
	}
	// The first page creates the topics.
	publish(msgs)
	b.ReportAllocs()
	cpu := cpuTime(b)
	b.ResetTimer()
	for n := b.N; n > 0; n -= page {
		publish(msgs[:min(n, page)])
	}
	b.StopTimer()
	// The process's CPU time, the broker's background work and the
	// collector's included, is steadier than the wall time, which the
	// journal's fsyncs and other work on the machine move.
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
