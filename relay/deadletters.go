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
	"time"

	"github.com/jackc/pgx/v5"
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
// does: retry and discard act on unresolved ones).
type DeadLetterFilter struct {
	IDs      []int64
	Topic    string
	Key      *string
	Reason   string
	Since    *time.Time
	Until    *time.Time
	Resolved bool
}

// Empty reports whether f selects by nothing at all.
func (f DeadLetterFilter) Empty() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == nil && f.Reason == "" && f.Since == nil && f.Until == nil
}

const deadLetterWhere = `($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR topic = $2) AND ($3::text IS NULL OR key = $3)
AND ($4::text IS NULL OR reason = $4) AND ($5::timestamptz IS NULL OR failed_at >= $5) AND ($6::timestamptz IS NULL OR failed_at < $6)`

func (f DeadLetterFilter) args() []any {
	var ids []int64
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	var topic, reason *string
	if f.Topic != "" {
		topic = &f.Topic
	}
	if f.Reason != "" {
		reason = &f.Reason
	}
	return []any{ids, topic, f.Key, reason, f.Since, f.Until}
}

// DeadLetter is one row of <schema>.dead_letters.
type DeadLetter struct {
	ID         int64      `json:"id"`
	EventRowID int64      `json:"event_row_id"`
	EventID    string     `json:"event_id"`
	Topic      string     `json:"topic"`
	Key        *string    `json:"key"`
	Payload    []byte     `json:"payload"`
	Headers    *string    `json:"headers"`
	CreatedAt  time.Time  `json:"created_at"`
	FailedAt   time.Time  `json:"failed_at"`
	Reason     string     `json:"reason"`
	Error      string     `json:"error"`
	Resolution string     `json:"resolution,omitempty"`
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	Note       string     `json:"note,omitempty"`
	// Holds: this dead letter holds its key (hold-key policy); with a
	// resolution, the leader is releasing it.
	Holds bool `json:"holds,omitempty"`
	// HeldBy is set on a held event: the outbox row id of the dead letter
	// that holds it.
	HeldBy *int64 `json:"held_by,omitempty"`
}

// ListDeadLetters returns up to limit dead letters matching f, oldest
// first.
func ListDeadLetters(ctx context.Context, db DB, schema string, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	q := `SELECT id, event_row_id, event_id::text, topic, key, payload, headers::text, created_at, failed_at, reason, error,
    coalesce(resolution, ''), resolved_at, coalesce(note, ''), holds, held_by
FROM ` + ident(schema, "dead_letters") + ` WHERE ` + deadLetterWhere + ` AND ($7 OR resolution IS NULL) ORDER BY id LIMIT $8`
	rows, err := db.Query(ctx, q, append(f.args(), f.Resolved, limit)...)
	if err != nil {
		return nil, fmt.Errorf("reading dead letters (is the schema migrated?): %w", err)
	}
	defer rows.Close()
	out := []DeadLetter{}
	for rows.Next() {
		var d DeadLetter
		if err := rows.Scan(&d.ID, &d.EventRowID, &d.EventID, &d.Topic, &d.Key, &d.Payload, &d.Headers, &d.CreatedAt, &d.FailedAt,
			&d.Reason, &d.Error, &d.Resolution, &d.ResolvedAt, &d.Note, &d.Holds, &d.HeldBy); err != nil {
			return nil, fmt.Errorf("reading dead letters: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
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
	q := `WITH picked AS (
    UPDATE ` + ident(schema, "dead_letters") + ` SET resolution = 'retried', resolved_at = now()
    WHERE resolution IS NULL AND held_by IS NULL AND ` + deadLetterWhere + ` RETURNING id, holds, event_id, topic, key, payload, headers, created_at),
put AS (INSERT INTO ` + ident(schema, "events") + ` (event_id, topic, key, payload, headers, created_at)
    SELECT event_id, topic, key, payload, headers, created_at FROM picked WHERE NOT holds ORDER BY id)
SELECT count(*) FROM picked`
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, q, f.args()...).Scan(&n)
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
	q := `UPDATE ` + ident(schema, "dead_letters") + ` SET resolution = 'discarded', resolved_at = now(), note = $7
WHERE resolution IS NULL AND held_by IS NULL AND ` + deadLetterWhere
	tag, err := db.Exec(ctx, q, append(f.args(), note)...)
	if err != nil {
		return 0, fmt.Errorf("discarding dead letters: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Beginner is a connection or pool that starts transactions.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}
