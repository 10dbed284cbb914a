package embedded_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/sink/embedded"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

func messages(from, n int) []relay.Message {
	var out []relay.Message
	for i := from; i < from+n; i++ {
		out = append(out, relay.Message{
			Topic:     "orders",
			Key:       fmt.Appendf(nil, "key-%d", i%7),
			Value:     fmt.Appendf(nil, "event-%d", i),
			Headers:   []relay.Header{{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "id-%d", i)}},
			Timestamp: time.UnixMilli(int64(1_700_000_000_000 + i)),
		})
	}
	return out
}

func newSink(t *testing.T, dir string) *embedded.Sink {
	t.Helper()
	s, err := embedded.New(embedded.Config{Broker: broker.Options{Dir: dir, DefaultPartitions: 3, JanitorInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readAll(t *testing.T, dir string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, r := range e2e.ReadLog(t, dir, "orders") {
		counts[string(r.Value)]++
	}
	return counts
}

// TestRepublishAfterLostAcknowledgement publishes batches whose
// acknowledgement is then lost (the saved state stays at an earlier
// point), restarts the sink from that state and publishes the same
// messages again, with different batch boundaries: each event must be in
// the log once.
func TestRepublishAfterLostAcknowledgement(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := newSink(t, dir)
	if err := s.Start(ctx, relay.Session{}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Publish(ctx, messages(0, 10))
	if err != nil {
		t.Fatal(err)
	}
	saved := res.State
	// Published, never acknowledged.
	if _, err := s.Publish(ctx, messages(10, 15)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Publish(ctx, messages(25, 5)); err != nil {
		t.Fatal(err)
	}
	s.Close(ctx)

	s = newSink(t, dir)
	if err := s.Start(ctx, relay.Session{State: saved}); err != nil {
		t.Fatal(err)
	}
	// Redelivery in other batch sizes, then new events.
	for _, r := range [][2]int{{10, 7}, {17, 13}, {30, 10}} {
		if _, err := s.Publish(ctx, messages(r[0], r[1])); err != nil {
			t.Fatalf("republishing %v: %v", r, err)
		}
	}
	s.Close(ctx)

	counts := readAll(t, dir)
	for i := 0; i < 40; i++ {
		if got := counts[fmt.Sprintf("event-%d", i)]; got != 1 {
			t.Errorf("event-%d is in the log %d times", i, got)
		}
	}
}

func TestSinkConformance(t *testing.T) {
	relaytest.RunSinkTests(t, func(t *testing.T) relaytest.SinkHarness {
		dir := t.TempDir()
		return relaytest.SinkHarness{
			New: func(t *testing.T) relay.Sink { return newSink(t, dir) },
			Read: func(t *testing.T, topic string) []relaytest.Record {
				var out []relaytest.Record
				for _, r := range e2e.ReadLog(t, dir, topic) {
					rec := relaytest.Record{Partition: r.Partition, Key: r.KeyBytes, Value: r.Value, Timestamp: r.Timestamp}
					for _, h := range r.HeaderList {
						rec.Headers = append(rec.Headers, relay.Header{Key: h.Key, Value: h.Value})
					}
					out = append(out, rec)
				}
				return out
			},
			Partitions:  3,
			ExactlyOnce: true,
		}
	})
}
