package relay

// Managing dead letters: listing them, and resolving each once, by retry
// (its event goes back into the outbox, with its original event id, so
// consumers that already saw it can deduplicate) or by discard (on
// purpose, with a note). Resolved rows stay, as the record of what was
// done (migration 007). Under the hold-key policy (hold.go) a dead letter
// may hold its key; resolving it only marks it, and the leader then
// publishes it (for a retry) and the events held behind it, in order
// (release.go). Held events are not dead letters: they are listed, but
// retried or discarded only with the dead letter that holds them.

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

// Dead-letter resolutions.
const (
	DeadLetterRetried   = "retried"
	DeadLetterDiscarded = "discarded"
	// DeadLetterReleased marks a held event published by a release.
	DeadLetterReleased = "released"
)

// DeadLetterFilter selects dead letters. Zero fields select everything;
// Resolved includes those already retried or discarded (only listing
// does: retry and discard act on unresolved ones). It is the store's
// filter, which turns it into the statements' arguments.
type DeadLetterFilter = store.DeadLetterFilter

// DeadLetter is one row of <schema>.dead_letters.
type DeadLetter = store.DeadLetter

// ListDeadLetters returns up to limit dead letters matching f, oldest
// first.
func ListDeadLetters(ctx context.Context, db DB, schema string, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	out, err := storageOf(schema).ListDeadLetters(ctx, db, f, limit)
	if err != nil {
		return nil, fmt.Errorf("reading dead letters (is the schema migrated?): %w", err)
	}
	return out, nil
}

// GetDeadLetter reads one dead letter, resolved or not.
func GetDeadLetter(ctx context.Context, db DB, schema string, id int64) (DeadLetter, error) {
	ds, err := ListDeadLetters(ctx, db, schema, DeadLetterFilter{IDs: []int64{id}, Resolved: true}, 1)
	if err != nil {
		return DeadLetter{}, err
	}
	if len(ds) == 0 {
		return DeadLetter{}, fmt.Errorf("dead letter %d does not exist", id)
	}
	return ds[0], nil
}

// ErrNoFilter is returned by RetryDeadLetters and DiscardDeadLetters for an
// empty filter unless all is set: acting on every dead letter at once
// should be said out loud.
var ErrNoFilter = errors.New("no dead letters named: give ids or a filter, or say all")

// RetryDeadLetters puts the events of the unresolved dead letters matching
// f back into the outbox, in the order they failed, each with its original
// event id, topic, key, payload, headers and creation time, and marks them
// retried, in one transaction. A dead letter that holds its key is only
// marked: the leader publishes it and then its key's held events. Held
// events are not selected. It returns how many it retried.
func RetryDeadLetters(ctx context.Context, db Beginner, schema string, f DeadLetterFilter, all bool) (int64, error) {
	if f.Empty() && !all {
		return 0, ErrNoFilter
	}
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		var err error
		n, err = storageOf(schema).RetryDeadLetters(ctx, tx, f)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("retrying dead letters: %w", err)
	}
	return n, nil
}

// DiscardDeadLetters marks the unresolved dead letters matching f
// discarded, with note, and returns how many. The leader then publishes the
// events held behind those that hold their key. Held events are not
// selected.
func DiscardDeadLetters(ctx context.Context, db DB, schema string, f DeadLetterFilter, all bool, note string) (int64, error) {
	if f.Empty() && !all {
		return 0, ErrNoFilter
	}
	n, err := storageOf(schema).DiscardDeadLetters(ctx, db, f, note)
	if err != nil {
		return 0, fmt.Errorf("discarding dead letters: %w", err)
	}
	return n, nil
}

// Beginner is a connection or pool that starts transactions.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}
