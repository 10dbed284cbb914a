package store

// The operator's statements: `relay replay` and `relay dead-letters`
// (relay/replay.go, relay/deadletters.go).

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// RequestReplay records a replay request with filter (JSON text) and
// returns its id.
func (p *Postgres) RequestReplay(ctx context.Context, db DB, filter string) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `INSERT INTO `+p.ident("replay_requests")+` (filter) VALUES ($1::text::jsonb) RETURNING id`, filter).Scan(&id)
	return id, err
}

const replayColumns = `id, filter::text, status, total, done, coalesce(error, ''), created_at, started_at, updated_at, finished_at`

// ReplayRequest is one row of <schema>.replay_requests, its filter as
// JSON text.
type ReplayRequest struct {
	ID         int64
	Filter     string
	Status     string
	Total      *int64
	Done       int64
	Error      string
	CreatedAt  time.Time
	StartedAt  *time.Time
	UpdatedAt  time.Time
	FinishedAt *time.Time
}

func scanReplay(row pgx.Row) (ReplayRequest, error) {
	var q ReplayRequest
	err := row.Scan(&q.ID, &q.Filter, &q.Status, &q.Total, &q.Done, &q.Error, &q.CreatedAt, &q.StartedAt, &q.UpdatedAt, &q.FinishedAt)
	return q, err
}

// GetReplay reads replay request id; it reports false when there is none.
func (p *Postgres) GetReplay(ctx context.Context, db DB, id int64) (ReplayRequest, bool, error) {
	q, err := scanReplay(db.QueryRow(ctx, `SELECT `+replayColumns+` FROM `+p.ident("replay_requests")+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return ReplayRequest{}, false, nil
	}
	return q, err == nil, err
}

// ListReplays returns the limit most recent replay requests, newest
// first.
func (p *Postgres) ListReplays(ctx context.Context, db DB, limit int) ([]ReplayRequest, error) {
	rows, err := db.Query(ctx, `SELECT `+replayColumns+` FROM `+p.ident("replay_requests")+` ORDER BY id DESC LIMIT $1`, limit)
	return collectRows(rows, err, scanReplay)
}

// CancelReplay cancels request id if it is pending or running, and
// reports whether it was.
func (p *Postgres) CancelReplay(ctx context.Context, db DB, id int64) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE `+p.ident("replay_requests")+` SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = $1 AND status IN ('pending', 'running')`, id)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// DeadLetterFilter selects dead letters; zero fields select everything.
// Resolved includes those already resolved (only listing reads it).
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

// DeadLetter is one row of <schema>.dead_letters, as the relay package
// lists it and the CLI prints it (in JSON with these field names).
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
func (p *Postgres) ListDeadLetters(ctx context.Context, db DB, f DeadLetterFilter, limit int) ([]DeadLetter, error) {
	q := `SELECT id, event_row_id, event_id::text, topic, key, payload, headers::text, created_at, failed_at, reason, error,
    coalesce(resolution, ''), resolved_at, coalesce(note, ''), holds, held_by
FROM ` + p.ident("dead_letters") + ` WHERE ` + deadLetterWhere + ` AND ($7 OR resolution IS NULL) ORDER BY id LIMIT $8`
	rows, err := db.Query(ctx, q, append(f.args(), f.Resolved, limit)...)
	out, err := collectRows(rows, err, func(row pgx.Row) (DeadLetter, error) {
		var d DeadLetter
		err := row.Scan(&d.ID, &d.EventRowID, &d.EventID, &d.Topic, &d.Key, &d.Payload, &d.Headers, &d.CreatedAt, &d.FailedAt,
			&d.Reason, &d.Error, &d.Resolution, &d.ResolvedAt, &d.Note, &d.Holds, &d.HeldBy)
		return d, err
	})
	if out == nil && err == nil {
		out = []DeadLetter{} // none matched: an empty list, not nil
	}
	return out, err
}

// RetryDeadLetters marks the unresolved dead letters matching f (held
// events excepted) retried and puts the events of those that do not hold
// their key back into the outbox, in the order they failed; it returns
// how many it marked. Run it in a transaction: the statement is one, but
// its caller's contract is that the marks and the inserts commit
// together.
func (p *Postgres) RetryDeadLetters(ctx context.Context, tx DB, f DeadLetterFilter) (int64, error) {
	q := `WITH picked AS (
    UPDATE ` + p.ident("dead_letters") + ` SET resolution = 'retried', resolved_at = now()
    WHERE resolution IS NULL AND held_by IS NULL AND ` + deadLetterWhere + ` RETURNING id, holds, event_id, topic, key, payload, headers, created_at),
put AS (INSERT INTO ` + p.ident("events") + ` (event_id, topic, key, payload, headers, created_at)
    SELECT event_id, topic, key, payload, headers, created_at FROM picked WHERE NOT holds ORDER BY id)
SELECT count(*) FROM picked`
	var n int64
	err := tx.QueryRow(ctx, q, f.args()...).Scan(&n)
	return n, err
}

// DiscardDeadLetters marks the unresolved dead letters matching f (held
// events excepted) discarded with note, and returns how many.
func (p *Postgres) DiscardDeadLetters(ctx context.Context, db DB, f DeadLetterFilter, note string) (int64, error) {
	q := `UPDATE ` + p.ident("dead_letters") + ` SET resolution = 'discarded', resolved_at = now(), note = $7
WHERE resolution IS NULL AND held_by IS NULL AND ` + deadLetterWhere
	tag, err := db.Exec(ctx, q, append(f.args(), note)...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
