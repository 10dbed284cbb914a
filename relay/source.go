package relay

import (
	"context"
	"fmt"
	"time"
)

// Position is where an event sits in its source's delivery order. Positions
// of successive events from one source strictly increase. The polling reader
// uses (tick, ordinal within the tick's batch); the WAL reader uses (commit
// LSN, index within the transaction).
type Position struct {
	Major uint64
	Minor uint64
}

// Less reports whether p comes before q.
func (p Position) Less(q Position) bool {
	return p.Major < q.Major || (p.Major == q.Major && p.Minor < q.Minor)
}

// IsZero reports whether p is the zero position, before every event.
func (p Position) IsZero() bool { return p == Position{} }

func (p Position) String() string { return fmt.Sprintf("%d/%d", p.Major, p.Minor) }

// Event is one committed outbox row as a source delivers it.
type Event struct {
	// ID is the row's ordering id (outbox.events.id). A negative ID is an
	// event without a row (the WAL reader's logical messages, written by
	// emit_message): nothing is deleted or archived for it, and dead
	// letters record the ID as their event_row_id.
	ID int64
	// EventID is the row's uuid in its canonical text form.
	EventID string
	Topic   string
	// Key is nil for a NULL key.
	Key []byte
	// Payload is nil for a NULL payload (a tombstone).
	Payload []byte
	// Headers is the raw jsonb text, nil for NULL. The core parses and
	// checks it; a malformed value sends the event to the dead letters.
	Headers   []byte
	CreatedAt time.Time
	// CommittedAt is when the event's transaction committed, for sources
	// that know it (the WAL reader, from the commit record); zero
	// otherwise.
	CommittedAt time.Time
	// Position orders the event within its source.
	Position Position
	// TooLarge is set by a source that left Key, Payload and Headers out
	// because the row is larger than the message limit: the row's size in
	// bytes (key, payload and headers as JSON text). The core dead-letters
	// the event, copying the row's content into the dead letter in SQL, so
	// the relay never holds it.
	TooLarge int64
}

// HasRow reports whether the event is a row of the outbox table.
func (e Event) HasRow() bool { return e.ID > 0 }

// Source delivers committed outbox events in commit order: if transaction
// T1 committed before T2 began, T1's events come first. A source never
// deletes rows or confirms progress on its own; the core does that after the
// sink has made the events durable.
type Source interface {
	// Start prepares the source to deliver the events after from, the
	// position of the last event the core recorded as published (zero on
	// the first start). A source may deliver events at or before from again;
	// the core drops them.
	Start(ctx context.Context, from Position) error
	// Next blocks until at least one event is available, then returns up to
	// max events in order. All events of one source transaction that fit
	// are returned together. It returns ctx.Err() when ctx ends.
	Next(ctx context.Context, max int) ([]Event, error)
	// Acked tells the source that every event up to and including through
	// is durably published and recorded, so it may release what it holds
	// for them (the WAL reader advances its slot's flush position).
	Acked(ctx context.Context, through Position) error
	// Close releases the source's connections.
	Close(ctx context.Context) error
}

// Warner is implemented by sources that can tell of conditions an
// operator should know about that do not make the relay unready (the WAL
// reader's slot that would not survive a promotion of a standby). /readyz
// lists them as warnings, each one line.
type Warner interface {
	Warnings(ctx context.Context) []string
}

// Resetter is implemented by sources that keep progress of their own in
// the database (the WAL reader's replication slot). The core calls Reset
// before Start when the checkpoint was written by another kind of reader:
// that progress no longer matches what was published.
type Resetter interface {
	Reset(ctx context.Context) error
}
