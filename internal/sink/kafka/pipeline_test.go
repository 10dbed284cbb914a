package kafka_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// TestPipelinedErrorStopsLaterBatches: after a first batch went through,
// the cluster holds the produce request of batch 2 while batches 3 and 4
// are sent behind it, then refuses it with an error the client does not
// retry. The waits of 2, 3 and 4 fail, and no record of 3 or 4 reaches
// the partition after the refused ones went missing (the client would
// produce them under a bumped epoch): the log holds batch 1 alone. After
// the restart batches 2 to 4 are published, the log in order.
func TestPipelinedErrorStopsLaterBatches(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	kf := c.Kfake()
	// Hold the first request carrying batch 2's first record (sequence 20).
	h := holdProduce(kf, func(req *kmsg.ProduceRequest) bool { return firstSequence(req) == 20 }, kerr.InvalidRecord.Code)

	// One partition: every record is in one sequence.
	s := newSink(t, c.Addrs(), func(c *kafka.Config) { c.Partitions = 1; c.Compression = "none" })
	start(t, s, nil)
	ctx := context.Background()
	batch := func(i int) []relay.Message { return relaytest.Messages("orders", i*20, 20, 4) }
	w, err := s.PublishAsync(ctx, batch(0))
	if err == nil {
		_, err = w()
	}
	if err != nil {
		t.Fatalf("batch 1: %v", err)
	}
	var waits []func() (relay.PublishResult, error)
	for i := 1; i < 4; i++ {
		w, err := s.PublishAsync(ctx, batch(i))
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i+1, err)
		}
		waits = append(waits, w)
		if i == 1 {
			<-h.held
		}
		// Each batch in a request of its own, behind the held one.
		time.Sleep(20 * time.Millisecond) // deliberate pause: each batch in a request of its own
	}
	close(h.release)
	// The waits come late: what the client does after the refusal is not
	// helped by a wait noticing it.
	time.Sleep(500 * time.Millisecond) // deliberate pause: the waits come late (see above)
	for i, w := range waits {
		if _, err := w(); err == nil {
			t.Errorf("wait %d succeeded after batch 2 was refused", i+2)
		}
	}
	if _, err := s.PublishAsync(ctx, batch(1)); err == nil {
		t.Error("PublishAsync succeeded on a broken session")
	}
	first := values(relaytest.Messages("orders", 0, 20, 4))
	if got := values(kafkatest.Read(t, c.Addrs(), "orders", false)); !slices.Equal(got, first) {
		t.Fatalf("after batch 2 was refused the log holds %v, want batch 1 alone %v", got, first)
	}

	kf.DropControl()
	start(t, s, nil)
	for i := 1; i < 4; i++ {
		w, err := s.PublishAsync(ctx, batch(i))
		if err != nil {
			t.Fatalf("PublishAsync %d after the restart: %v", i+1, err)
		}
		waits[i-1] = w
	}
	for i, w := range waits {
		if _, err := w(); err != nil {
			t.Fatalf("wait %d after the restart: %v", i+2, err)
		}
	}
	if got, want := values(kafkatest.Read(t, c.Addrs(), "orders", false)), values(relaytest.Messages("orders", 0, 80, 4)); !slices.Equal(got, want) {
		t.Errorf("the log holds %v, want %v", got, want)
	}
}

// firstSequence is the producer sequence of the first record of req's
// first batch, -1 when it has none.
func firstSequence(req *kmsg.ProduceRequest) int32 {
	for _, tp := range req.Topics {
		for _, p := range tp.Partitions {
			var b kmsg.RecordBatch
			if err := b.ReadFrom(p.Records); err == nil {
				return b.FirstSequence
			}
		}
	}
	return -1
}

// TestPipelinedFenceAbandonsInFlight: with three batches outstanding and
// the first produce request held at the cluster, the fence fails: every
// wait fails with ErrNotLeader, no produce request reaches the cluster
// again and no record is in the log.
func TestPipelinedFenceAbandonsInFlight(t *testing.T) {
	t.Parallel()
	c, h, s, fence := startHeldFenced(t)
	ctx := context.Background()
	var waits []func() (relay.PublishResult, error)
	for i := range 3 {
		w, err := s.PublishAsync(ctx, relaytest.Messages("orders", i*30, 30, 4))
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i+1, err)
		}
		waits = append(waits, w)
		if i == 0 {
			<-h.held
		}
	}
	fence.tripped.Store(true)
	for i, w := range waits {
		if _, err := w(); !errorsIsNotLeader(err) {
			t.Errorf("wait %d after the fence failed: %v, want ErrNotLeader", i+1, err)
		}
	}
	sent := h.produces.n()
	close(h.release)
	<-h.answered
	s.Close(ctx)
	if n := h.produces.n(); n != sent {
		t.Errorf("%d produce requests reached the cluster after the fence failed", n-sent)
	}
	if records := kafkatest.Read(t, c.Addrs(), "orders", false); len(records) != 0 {
		t.Errorf("%d records in the log after the fence failed", len(records))
	}
}

// values are the records' values, or the messages'.
func values[T relaytest.Record | relay.Message](rs []T) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		switch r := any(r).(type) {
		case relaytest.Record:
			out[i] = string(r.Value)
		case relay.Message:
			out[i] = string(r.Value)
		}
	}
	return out
}

func errorsIsNotLeader(err error) bool { return errors.Is(err, relay.ErrNotLeader) }
