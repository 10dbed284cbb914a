package relaytest

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// Record is a record read back from a sink's destination.
type Record struct {
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []relay.Header
	Timestamp time.Time
}

// SinkHarness is how the suite reaches one destination.
type SinkHarness struct {
	// New returns a sink writing to the harness's destination; called again
	// to model a restart. The suite calls Start and Close.
	New func(t *testing.T) relay.Sink
	// Read returns every record of topic in the destination, in partition
	// order and, within a partition, in log order. The suite calls it only
	// after closing its sinks.
	Read func(t *testing.T, topic string) []Record
	// Partitions is the partition count of topics the sink creates.
	Partitions int32
	// ExactlyOnce says a republished batch must not appear twice (the
	// embedded broker); otherwise duplicates are allowed and counted.
	ExactlyOnce bool
}

// RunSinkTests runs the Sink conformance suite; harness gives each subtest
// a fresh destination.
func RunSinkTests(t *testing.T, harness func(t *testing.T) SinkHarness) {
	t.Run("RoundTripAndPartitioning", func(t *testing.T) { testRoundTrip(t, harness(t)) })
	t.Run("ResumesFromSavedState", func(t *testing.T) { testSavedState(t, harness(t)) })
	t.Run("RepublishAfterLostAcknowledgement", func(t *testing.T) { testLostAck(t, harness(t)) })
	t.Run("Readiness", func(t *testing.T) { testReady(t, harness(t)) })
	if _, ok := harness(t).New(t).(relay.PipelinedSink); ok {
		t.Run("PipelinedPublish", func(t *testing.T) { testPipelined(t, harness(t)) })
	}
}

// Messages returns n messages on topic numbered from first: keys cycle over
// keys (nil for key -1 when withNil), values name the message.
func Messages(topic string, first, n, keys int) []relay.Message {
	out := make([]relay.Message, 0, n)
	for i := first; i < first+n; i++ {
		m := relay.Message{
			Topic: topic,
			Key:   fmt.Appendf(nil, "key-%d", i%keys),
			Value: fmt.Appendf(nil, "%s-%d", topic, i),
			Headers: []relay.Header{
				{Key: "trace-id", Value: fmt.Appendf(nil, "t%d", i)},
				{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "%s-event-%d", topic, i)},
			},
			Timestamp: time.UnixMilli(1_760_000_000_000 + int64(i)),
		}
		out = append(out, m)
	}
	return out
}

func startSink(t *testing.T, h SinkHarness, state []byte) relay.Sink {
	t.Helper()
	s := h.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx, relay.Session{State: state}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return s
}

func publish(t *testing.T, s relay.Sink, msgs []relay.Message) relay.PublishResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.Publish(ctx, msgs)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if len(res.Failed) > 0 {
		t.Fatalf("Publish failed messages: %v", res.Failed)
	}
	return res
}

// closeSink ends the sink's session as a stopping relay does: Close, then
// Shutdown for a sink that keeps its log open between sessions.
func closeSink(t *testing.T, s relay.Sink) {
	t.Helper()
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if ss, ok := s.(relay.StandbySink); ok {
		if err := ss.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	}
}

func testRoundTrip(t *testing.T, h SinkHarness) {
	s := startSink(t, h, nil)
	msgs := Messages("orders", 0, 300, 17)
	msgs = append(msgs,
		relay.Message{Topic: "orders", Key: []byte("key-3"), Value: nil, Timestamp: time.UnixMilli(1_760_000_001_000),
			Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("tombstone")}}},
		relay.Message{Topic: "orders", Key: nil, Value: []byte("keyless"), Timestamp: time.UnixMilli(1_760_000_001_001),
			Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("keyless")}}},
	)
	publish(t, s, msgs[:100])
	publish(t, s, msgs[100:])
	publish(t, s, Messages("payments", 0, 10, 3))
	closeSink(t, s)

	records := h.Read(t, "orders")
	byValue := map[string]Record{}
	lastIndex := map[string]int{}
	var tombstones int
	for _, r := range records {
		if r.Value == nil {
			tombstones++
			if string(r.Key) != "key-3" {
				t.Fatalf("tombstone has key %q", r.Key)
			}
			continue
		}
		byValue[string(r.Value)] = r
	}
	if tombstones != 1 {
		t.Fatalf("%d tombstones (null values) read back, want 1", tombstones)
	}
	if kl, ok := byValue["keyless"]; !ok || kl.Key != nil {
		t.Fatalf("keyless message read back as %+v (found %v), want a null key", kl, ok)
	}
	for i, m := range msgs[:300] {
		r, ok := byValue[string(m.Value)]
		if !ok {
			t.Fatalf("message %s is missing", m.Value)
		}
		if !bytes.Equal(r.Key, m.Key) {
			t.Fatalf("message %s key = %q, want %q", m.Value, r.Key, m.Key)
		}
		if want := broker.PartitionForKey(m.Key, h.Partitions); r.Partition != want {
			t.Fatalf("key %s on partition %d, Kafka's partitioner says %d", m.Key, r.Partition, want)
		}
		if !r.Timestamp.Equal(m.Timestamp) {
			t.Fatalf("message %s timestamp = %v, want %v", m.Value, r.Timestamp, m.Timestamp)
		}
		if len(r.Headers) != len(m.Headers) {
			t.Fatalf("message %s headers = %v, want %v", m.Value, r.Headers, m.Headers)
		}
		for j := range m.Headers {
			if r.Headers[j].Key != m.Headers[j].Key || !bytes.Equal(r.Headers[j].Value, m.Headers[j].Value) {
				t.Fatalf("message %s headers = %v, want %v", m.Value, r.Headers, m.Headers)
			}
		}
		lastIndex[string(m.Key)] = i
	}
	CheckKeyOrder(t, records, "orders")
	if got := len(h.Read(t, "payments")); got < 10 {
		t.Fatalf("payments has %d records, want 10", got)
	}
}

// checkKeyOrder asserts each key's values appear in increasing message
// number, ignoring exact repeats of a value already seen.
func CheckKeyOrder(t *testing.T, records []Record, topic string) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, r := range records {
		var n int
		if _, err := fmt.Sscanf(string(r.Value), topic+"-%d", &n); err != nil {
			continue
		}
		if seen[string(r.Value)] {
			continue
		}
		seen[string(r.Value)] = true
		if prev, ok := last[string(r.Key)]; ok && n <= prev {
			t.Fatalf("key %s: message %d after %d", r.Key, n, prev)
		}
		last[string(r.Key)] = n
	}
}

func countValues(records []Record) map[string]int {
	c := map[string]int{}
	for _, r := range records {
		c[string(r.Value)]++
	}
	return c
}

// duplicates fails when one of the first n messages of topic is missing
// from records, and returns how many extra copies there are.
func duplicates(t *testing.T, records []Record, topic string, n int) int {
	t.Helper()
	counts := countValues(records)
	dups := 0
	for i := 0; i < n; i++ {
		c := counts[fmt.Sprintf("%s-%d", topic, i)]
		if c == 0 {
			t.Fatalf("%s-%d is missing", topic, i)
		}
		dups += c - 1
	}
	return dups
}

func testSavedState(t *testing.T, h SinkHarness) {
	s := startSink(t, h, nil)
	res := publish(t, s, Messages("orders", 0, 50, 5))
	closeSink(t, s)
	s = startSink(t, h, res.State)
	publish(t, s, Messages("orders", 50, 50, 5))
	closeSink(t, s)
	counts := countValues(h.Read(t, "orders"))
	for i := 0; i < 100; i++ {
		if c := counts[fmt.Sprintf("orders-%d", i)]; c != 1 {
			t.Fatalf("orders-%d appears %d times after a clean restart, want 1", i, c)
		}
	}
}

func testLostAck(t *testing.T, h SinkHarness) {
	s := startSink(t, h, nil)
	saved := publish(t, s, Messages("orders", 0, 40, 7)).State
	// Published, but the acknowledgement never committed.
	publish(t, s, Messages("orders", 40, 30, 7))
	publish(t, s, Messages("orders", 70, 30, 7))
	closeSink(t, s)

	s = startSink(t, h, saved)
	// The source re-delivers from the saved point, in other batch sizes.
	publish(t, s, Messages("orders", 40, 45, 7))
	publish(t, s, Messages("orders", 85, 35, 7))
	closeSink(t, s)

	records := h.Read(t, "orders")
	dups := duplicates(t, records, "orders", 120)
	if h.ExactlyOnce && dups > 0 {
		t.Fatalf("%d duplicates after republishing; this sink promises exactly once", dups)
	}
	t.Logf("%d duplicates after republishing 60 messages (exactly once: %v)", dups, h.ExactlyOnce)
	CheckKeyOrder(t, records, "orders")
}

func testReady(t *testing.T, h SinkHarness) {
	s := startSink(t, h, nil)
	if err := s.Ready(context.Background()); err != nil {
		t.Fatalf("Ready after Start: %v", err)
	}
	closeSink(t, s)
}

// testPipelined writes batches before the earlier ones are durable, then
// restarts from the state of a batch in the middle, as after a crash with
// batches in flight, and republishes the rest in other batch sizes.
func testPipelined(t *testing.T, h SinkHarness) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := startSink(t, h, nil)
	ps := s.(relay.PipelinedSink)
	var waits []func() (relay.PublishResult, error)
	for i := 0; i < 6; i++ {
		wait, err := ps.PublishAsync(ctx, Messages("orders", i*50, 50, 7))
		if err != nil {
			t.Fatalf("PublishAsync %d: %v", i, err)
		}
		waits = append(waits, wait)
	}
	var saved []byte
	for i, wait := range waits {
		res, err := wait()
		if err != nil {
			t.Fatalf("wait %d: %v", i, err)
		}
		if len(res.Failed) > 0 {
			t.Fatalf("batch %d failed messages: %v", i, res.Failed)
		}
		if i == 2 {
			saved = res.State
		}
	}
	closeSink(t, s)

	// Batches 3 to 5 were durable, but their acknowledgement never
	// committed: the source re-delivers them.
	s = startSink(t, h, saved)
	ps = s.(relay.PipelinedSink)
	waits = waits[:0]
	for first := 150; first < 330; first += 60 {
		wait, err := ps.PublishAsync(ctx, Messages("orders", first, 60, 7))
		if err != nil {
			t.Fatalf("PublishAsync from %d after the restart: %v", first, err)
		}
		waits = append(waits, wait)
	}
	for i, wait := range waits {
		if _, err := wait(); err != nil {
			t.Fatalf("wait %d after the restart: %v", i, err)
		}
	}
	closeSink(t, s)

	records := h.Read(t, "orders")
	dups := duplicates(t, records, "orders", 330)
	if h.ExactlyOnce && dups > 0 {
		t.Fatalf("%d duplicates after republishing pipelined batches; this sink promises exactly once", dups)
	}
	CheckKeyOrder(t, records, "orders")
}
