package relay

import (
	"context"
	"time"
)

// Header is one record header.
type Header struct {
	Key   string
	Value []byte
}

// Message is one record for a sink: an outbox event after routing.
type Message struct {
	Topic string
	// Key picks the partition with Kafka's default partitioner; nil means
	// no key.
	Key []byte
	// Value nil is a tombstone.
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// EventID returns the relay-event-id header's value, nil without one. The
// core appends its headers after the row's own, so the last header with
// that name is the relay's.
func (m Message) EventID() []byte {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == HeaderEventID {
			return m.Headers[i].Value
		}
	}
	return nil
}

// Identity names what m publishes: its event id and, for a republished
// event, the replay request, so that a replay is never mistaken for the
// event's first publication. Empty for a message without an event id.
func (m Message) Identity() string {
	var id, replay []byte
	for i := len(m.Headers) - 1; i >= 0 && (id == nil || replay == nil); i-- {
		switch m.Headers[i].Key {
		case HeaderEventID:
			if id == nil {
				id = m.Headers[i].Value
			}
		case HeaderReplay:
			if replay == nil {
				replay = m.Headers[i].Value
			}
		}
	}
	return Identity(id, replay)
}

// Identity is the identity of a record with these relay-event-id and
// relay-replay header values (nil when absent): what a sink compares to
// tell whether an event is already in its log.
func Identity(eventID, replay []byte) string {
	if len(eventID) == 0 {
		return ""
	}
	if replay == nil {
		return string(eventID)
	}
	return string(eventID) + " replay " + string(replay)
}

// Record headers the core adds to every message, after the event's own.
const (
	// HeaderEventID carries the outbox row's event id, so any consumer can
	// deduplicate.
	HeaderEventID = "relay-event-id"
	// HeaderCreatedAt carries the row's created_at in RFC 3339 with
	// nanoseconds (the record timestamp keeps only milliseconds).
	HeaderCreatedAt = "relay-created-at"
)

// Session is what the core hands a sink when a pipeline session starts.
type Session struct {
	// State is the State saved with the last acknowledged batch (nil on
	// the first start).
	State []byte
	// Fence returns nil while this relay is the leader, else an error
	// wrapping ErrNotLeader. A sink calls it before every append and stops
	// appending once it fails, so that a deposed leader writes nothing
	// after its lease. Nil means never fenced.
	Fence func() error
	// Placements asks the sink to report where each message landed
	// (PublishResult.Placements); the core asks only while it traces.
	Placements bool
}

// CheckFence calls s.Fence when it is set.
func (s Session) CheckFence() error {
	if s.Fence == nil {
		return nil
	}
	return s.Fence()
}

// PublishResult is what Publish reports for a batch it accepted.
type PublishResult struct {
	// Failed maps the index of each message that can never be published
	// (too large for the destination, a topic it refuses) to its error.
	// The core moves those to the dead letters; every other message is
	// durable.
	Failed map[int]error
	// State is the sink's progress to save with the acknowledgement, in
	// the same Postgres transaction that removes the published rows. It is
	// handed back to Start after a restart. Nil means nothing to save.
	State []byte
	// Placements, when the session asked for them and the sink knows
	// them, has an entry for each message, by index: where it landed.
	// Nil, or an entry of Partition -1, is unknown.
	Placements []Placement
}

// Placement is where a published message landed: its partition and
// offset (Offset -1 when the sink does not learn it).
type Placement struct {
	Partition int32
	Offset    int64
}

// NewPlacements returns n placements, all unknown.
func NewPlacements(n int) []Placement {
	p := make([]Placement, n)
	for i := range p {
		p[i] = Placement{Partition: -1, Offset: -1}
	}
	return p
}

// Sink publishes messages to a log.
//
// The core calls Publish with consecutive batches in source order and
// acknowledges a batch's rows only after Publish returned for it. When
// Publish returns an error the core stops, restarts the sink with Start and
// the last saved state, and delivers the unacknowledged events again from
// the source, in an order and a set that may differ from the first time
// (rows deleted by an operator, a WAL reader that lost its slot and reads
// the table instead): a sink that can tell what it already made durable
// (the embedded broker) decides it by each message's identity, its event id
// and replay request, never by its position.
type Sink interface {
	// Start prepares the sink for a session of the pipeline.
	Start(ctx context.Context, s Session) error
	// Publish makes every message durable (embedded: fsynced; Kafka:
	// acknowledged by all in-sync replicas), keeping their order within
	// each partition, and returns only then.
	Publish(ctx context.Context, msgs []Message) (PublishResult, error)
	// Ready returns nil when the sink can accept messages, else why not.
	Ready(ctx context.Context) error
	// Close flushes and releases the sink.
	Close(ctx context.Context) error
}

// A StandbySink keeps what it publishes into open between its sessions
// (the embedded broker keeps serving its Kafka listener's consumers while
// the pipeline restarts or PostgreSQL is away). The core calls Standby when
// it sees that another relay has led since this one did: the sink then
// lets go of it; and Shutdown when Run returns.
type StandbySink interface {
	Sink
	Standby()
	Shutdown(ctx context.Context) error
}

// A PipelinedSink can take a batch before the previous one is durable. The
// core then keeps a few batches in flight: it encodes and writes the next
// batch while the previous one's fsync (or broker round trip) runs, and one
// fsync can cover several batches.
type PipelinedSink interface {
	Sink
	// PublishAsync writes msgs behind every earlier batch, keeping their
	// order within each partition, and returns without waiting for them to
	// be durable. Its wait returns what Publish would have, once they are.
	// The core calls the waits in the order of the PublishAsync calls,
	// acknowledges nothing before its wait returned nil, and after any
	// error restarts the sink with Start and the last saved state.
	PublishAsync(ctx context.Context, msgs []Message) (wait func() (PublishResult, error), err error)
}
