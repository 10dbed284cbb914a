package kafka_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
)

// TestPlacementsReported: a session that asks for placements (the core
// does while tracing) gets each message's partition and offset, as a
// Kafka consumer reads them back, from Publish and PublishAsync, in both
// modes; a session that does not ask gets none.
func TestPlacementsReported(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		c := kafkatest.Start(t)
		var adjust func(*kafka.Config)
		if txn {
			adjust = transactional("relay-placements")
		}
		ctx := context.Background()
		batch := func(from int) []relay.Message {
			var msgs []relay.Message
			for i := from; i < from+6; i++ {
				msgs = append(msgs, relay.Message{Topic: "placed", Key: []byte(fmt.Sprint("k", i)), Value: []byte("v"), Timestamp: time.Now(),
					Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte(fmt.Sprint("e", i))}}})
			}
			return msgs
		}

		s := newSink(t, c.Addrs(), adjust)
		if err := s.Start(ctx, relay.Session{}); err != nil {
			t.Fatal(err)
		}
		res, err := s.Publish(ctx, batch(0))
		if err != nil {
			t.Fatal(err)
		}
		if res.Placements != nil {
			t.Errorf("placements %v reported without being asked", res.Placements)
		}
		s.Close(ctx)

		s = newSink(t, c.Addrs(), adjust)
		if err := s.Start(ctx, relay.Session{Placements: true}); err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		got := map[string]relay.Placement{}
		keep := func(msgs []relay.Message, res relay.PublishResult) {
			t.Helper()
			if len(res.Placements) != len(msgs) {
				t.Fatalf("%d placements for %d messages", len(res.Placements), len(msgs))
			}
			for i, m := range msgs {
				got[string(m.EventID())] = res.Placements[i]
			}
		}
		msgs := batch(10)
		if res, err = s.Publish(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		keep(msgs, res)
		msgs = batch(20)
		wait, err := s.PublishAsync(ctx, msgs)
		if err != nil {
			t.Fatal(err)
		}
		if res, err = wait(); err != nil {
			t.Fatal(err)
		}
		keep(msgs, res)

		n := 0
		for _, r := range kafkatest.ReadRecords(t, c.Addrs(), "placed", txn) {
			var id string
			for _, h := range r.Headers {
				if h.Key == relay.HeaderEventID {
					id = string(h.Value)
				}
			}
			p, ok := got[id]
			if !ok {
				continue
			}
			n++
			if p.Partition != r.Partition || p.Offset != r.Offset {
				t.Errorf("event %s reported at %d/%d, read at %d/%d", id, p.Partition, p.Offset, r.Partition, r.Offset)
			}
		}
		if n != len(got) {
			t.Errorf("read back %d of the %d placed events", n, len(got))
		}
	})
}
