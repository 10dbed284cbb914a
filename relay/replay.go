package relay

// Replay requests: how `relay replay` asks the leader to republish
// archived events, and how their progress is read (see replayer.go for
// how the leader executes them).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// HeaderReplay marks a republished event; its value is the replay request
// id. The event keeps its original relay-event-id header.
const HeaderReplay = "relay-replay"

// Replay request statuses.
const (
	ReplayPending   = "pending"
	ReplayRunning   = "running"
	ReplayDone      = "done"
	ReplayCancelled = "cancelled"
	ReplayFailed    = "failed"
)

// ReplayFilter selects archived events to republish: those created in
// [Since, Until), or from the event FromEvent on in publication order,
// optionally of one topic and one key.
type ReplayFilter struct {
	Since     *time.Time `json:"since,omitempty"`
	Until     *time.Time `json:"until,omitempty"`
	FromEvent string     `json:"from_event,omitempty"`
	Topic     string     `json:"topic,omitempty"`
	Key       *string    `json:"key,omitempty"`
}

// Validate checks that f selects a starting point.
func (f ReplayFilter) Validate() error {
	if (f.Since == nil) == (f.FromEvent == "") {
		return errors.New("a replay needs exactly one of a start time (since) or a start event (from_event)")
	}
	if f.Since != nil && f.Until != nil && !f.Until.After(*f.Since) {
		return errors.New("the replay's until must be after its since")
	}
	return nil
}

// DB is what the replay functions need of a connection, pool or
// transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ReplayRequest is one row of <schema>.replay_requests.
type ReplayRequest struct {
	ID         int64        `json:"id"`
	Filter     ReplayFilter `json:"filter"`
	Status     string       `json:"status"`
	Total      *int64       `json:"total"`
	Done       int64        `json:"done"`
	Error      string       `json:"error,omitempty"`
	CreatedAt  time.Time    `json:"created_at"`
	StartedAt  *time.Time   `json:"started_at,omitempty"`
	UpdatedAt  time.Time    `json:"updated_at"`
	FinishedAt *time.Time   `json:"finished_at,omitempty"`
}

// Finished reports whether the request will make no more progress.
func (q ReplayRequest) Finished() bool {
	return q.Status == ReplayDone || q.Status == ReplayCancelled || q.Status == ReplayFailed
}

func ident(schema, name string) string { return pgx.Identifier{schema, name}.Sanitize() }

// replayStart returns the archive seq after which f's events begin, and
// false when f names an event the archive does not hold.
func replayStart(ctx context.Context, db DB, schema string, f ReplayFilter) (int64, bool, error) {
	var start *int64
	var err error
	if f.FromEvent != "" {
		err = db.QueryRow(ctx, `SELECT min(seq) - 1 FROM `+ident(schema, "events_archive")+` WHERE event_id = $1::uuid`, f.FromEvent).Scan(&start)
	} else {
		err = db.QueryRow(ctx, `SELECT min(seq) - 1 FROM `+ident(schema, "events_archive")+` WHERE created_at >= $1`, *f.Since).Scan(&start)
	}
	if err != nil {
		return 0, false, fmt.Errorf("finding the replay's first event: %w", err)
	}
	if start == nil {
		if f.FromEvent != "" {
			return 0, false, nil
		}
		// Nothing that recent yet: the range is empty.
		var top int64
		if err := db.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+ident(schema, "events_archive")).Scan(&top); err != nil {
			return 0, false, err
		}
		return top, true, nil
	}
	return *start, true, nil
}

const archiveFilter = ` AND ($3::timestamptz IS NULL OR created_at >= $3) AND ($4::timestamptz IS NULL OR created_at < $4)
AND ($5::text IS NULL OR topic = $5) AND ($6::text IS NULL OR key = $6)`

func filterArgs(f ReplayFilter) []any {
	var topic *string
	if f.Topic != "" {
		topic = &f.Topic
	}
	return []any{f.Since, f.Until, topic, f.Key}
}

// CountReplay counts the archived events a replay with filter f would
// republish now (the dry run).
func CountReplay(ctx context.Context, db DB, schema string, f ReplayFilter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	start, ok, err := replayStart(ctx, db, schema, f)
	if err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("event %s is not in the archive (was the relay run with --retain?)", f.FromEvent)
		}
		return 0, err
	}
	var n int64
	args := append([]any{start, int64(1<<63 - 1)}, filterArgs(f)...)
	err = db.QueryRow(ctx, `SELECT count(*) FROM `+ident(schema, "events_archive")+` WHERE seq > $1 AND seq <= $2`+archiveFilter, args...).Scan(&n)
	return n, err
}

// RequestReplay records a replay request for the leader to execute and
// returns its id.
func RequestReplay(ctx context.Context, db DB, schema string, f ReplayFilter) (int64, error) {
	if err := f.Validate(); err != nil {
		return 0, err
	}
	filter, err := json.Marshal(f)
	if err != nil {
		return 0, err
	}
	var id int64
	err = db.QueryRow(ctx, `INSERT INTO `+ident(schema, "replay_requests")+` (filter) VALUES ($1::text::jsonb) RETURNING id`, string(filter)).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("recording the replay request: %w", err)
	}
	return id, nil
}

const replayColumns = `id, filter::text, status, total, done, coalesce(error, ''), created_at, started_at, updated_at, finished_at`

func scanReplay(row pgx.Row) (ReplayRequest, error) {
	var q ReplayRequest
	var filter string
	if err := row.Scan(&q.ID, &filter, &q.Status, &q.Total, &q.Done, &q.Error, &q.CreatedAt, &q.StartedAt, &q.UpdatedAt, &q.FinishedAt); err != nil {
		return q, err
	}
	if err := json.Unmarshal([]byte(filter), &q.Filter); err != nil {
		return q, fmt.Errorf("replay request %d has an unreadable filter: %w", q.ID, err)
	}
	return q, nil
}

// GetReplay reads one replay request.
func GetReplay(ctx context.Context, db DB, schema string, id int64) (ReplayRequest, error) {
	q, err := scanReplay(db.QueryRow(ctx, `SELECT `+replayColumns+` FROM `+ident(schema, "replay_requests")+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return q, fmt.Errorf("replay request %d does not exist", id)
	}
	return q, err
}

// ListReplays returns the most recent replay requests, newest first.
func ListReplays(ctx context.Context, db DB, schema string, limit int) ([]ReplayRequest, error) {
	rows, err := db.Query(ctx, `SELECT `+replayColumns+` FROM `+ident(schema, "replay_requests")+` ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ReplayRequest
	for rows.Next() {
		q, err := scanReplay(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, rows.Err()
}

// CancelReplay stops a pending or running replay; events already
// republished stay in the log. It reports whether the request was still
// unfinished.
func CancelReplay(ctx context.Context, db DB, schema string, id int64) (bool, error) {
	tag, err := db.Exec(ctx, `UPDATE `+ident(schema, "replay_requests")+` SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE id = $1 AND status IN ('pending', 'running')`, id)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}
