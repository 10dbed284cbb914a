package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// replaySQL are the statements the leader runs for retention and replay
// (relay/replayer.go).
type replaySQL struct {
	archive, prune, pick, resume, lockRequest, start, fail, chunk, mark, ack string
}

func newReplaySQL(ident func(string) string) replaySQL {
	events, archive, requests := ident("events"), ident("events_archive"), ident("replay_requests")
	return replaySQL{
		// $1: every acknowledged row id; $2: the published ones in
		// publication order, which the identity seq keeps.
		// Returns the ids it removed (archived or, dead letters, just
		// deleted), so that the caller can tell which were not yet visible.
		archive: `WITH moved AS (DELETE FROM ` + events + ` WHERE id = ANY($1::bigint[]) RETURNING *),
kept AS (
    INSERT INTO ` + archive + ` (id, txid, event_id, topic, key, payload, headers, created_at)
    SELECT m.id, m.txid, m.event_id, m.topic, m.key, m.payload, m.headers, m.created_at
    FROM unnest($2::bigint[]) WITH ORDINALITY AS o(id, n) JOIN moved AS m ON m.id = o.id
    ORDER BY o.n
    RETURNING 1)
SELECT id FROM moved`,
		prune: `DELETE FROM ` + archive + ` WHERE seq IN (
    SELECT seq FROM ` + archive + ` WHERE published_at < now() - $1::interval
      AND seq <= coalesce((SELECT min(cursor) FROM ` + requests + ` WHERE status = 'running' OR inflight_through IS NOT NULL), 9223372036854775807)
    ORDER BY seq LIMIT $2)`,
		pick:        `SELECT id FROM ` + requests + ` WHERE status IN ('pending', 'running') AND inflight_through IS NULL ORDER BY id LIMIT 1`,
		resume:      `SELECT id, filter::text, cursor, inflight_through FROM ` + requests + ` WHERE inflight_through IS NOT NULL ORDER BY id LIMIT 1`,
		lockRequest: `SELECT filter::text, status, cursor, bound, inflight_through FROM ` + requests + ` WHERE id = $1 FOR UPDATE`,
		start: `UPDATE ` + requests + ` SET status = 'running', cursor = $2, bound = $3, total = $4, started_at = now(), updated_at = now()
WHERE id = $1`,
		fail:  `UPDATE ` + requests + ` SET status = 'failed', error = $2, finished_at = now(), updated_at = now() WHERE id = $1`,
		chunk: `SELECT seq, id, event_id::text, topic, key, payload, headers::text, created_at FROM ` + archive + ` WHERE seq > $1 AND seq <= $2` + archiveFilter + ` ORDER BY seq LIMIT $7`,
		mark:  `UPDATE ` + requests + ` SET inflight_through = $2, updated_at = now() WHERE id = $1`,
		ack: `UPDATE ` + requests + ` SET cursor = $2, inflight_through = NULL, done = done + $3, updated_at = now(),
    status = CASE WHEN status = 'running' AND $2 >= bound THEN 'done' ELSE status END,
    finished_at = CASE WHEN status = 'running' AND $2 >= bound THEN now() ELSE finished_at END
WHERE id = $1`,
	}
}

const archiveFilter = ` AND ($3::timestamptz IS NULL OR created_at >= $3) AND ($4::timestamptz IS NULL OR created_at < $4)
AND ($5::text IS NULL OR topic = $5) AND ($6::text IS NULL OR key = $6)`

// ArchiveFilter selects archived events: created in [Since, Until), of
// Topic, with Key; nil and empty fields select everything.
type ArchiveFilter struct {
	Since, Until *time.Time
	Topic        string
	Key          *string
}

func (f ArchiveFilter) args() []any {
	var topic *string
	if f.Topic != "" {
		topic = &f.Topic
	}
	return []any{f.Since, f.Until, topic, f.Key}
}

// ArchiveRows deletes the outbox rows ids and archives those of published
// among them, in published's order; it returns the ids it deleted. tx
// must be fenced.
func (p *Postgres) ArchiveRows(ctx context.Context, tx DB, ids, published []int64) ([]int64, error) {
	rows, err := tx.Query(ctx, p.replay.archive, ids, published)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// PruneArchive deletes up to limit archived events published more than
// olderThan (an interval's text) ago, keeping those a running or in-flight
// replay has not passed; it returns how many it deleted.
func (p *Postgres) PruneArchive(ctx context.Context, db DB, olderThan string, limit int) (int64, error) {
	tag, err := db.Exec(ctx, p.replay.prune, olderThan, limit)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// PickReplay returns the oldest pending or running replay request with no
// chunk in flight; it reports false when there is none.
func (p *Postgres) PickReplay(ctx context.Context, db DB) (int64, bool, error) {
	return scanID(db.QueryRow(ctx, p.replay.pick))
}

// InFlight is a replay chunk handed to the sink and not acknowledged.
type InFlight struct {
	Request         int64
	Filter          string
	Cursor, Through int64
}

// ReplayInFlight returns the oldest request with a chunk in flight; it
// reports false when there is none.
func (p *Postgres) ReplayInFlight(ctx context.Context, db DB) (InFlight, bool, error) {
	var f InFlight
	err := db.QueryRow(ctx, p.replay.resume).Scan(&f.Request, &f.Filter, &f.Cursor, &f.Through)
	if errors.Is(err, pgx.ErrNoRows) {
		return InFlight{}, false, nil
	}
	return f, err == nil, err
}

// ReplayState is a replay request as the leader steps it.
type ReplayState struct {
	Filter, Status         string
	Cursor                 int64
	Bound, InflightThrough *int64
}

// LockReplay reads request id and locks it until tx ends.
func (p *Postgres) LockReplay(ctx context.Context, tx DB, id int64) (ReplayState, error) {
	var s ReplayState
	err := tx.QueryRow(ctx, p.replay.lockRequest, id).Scan(&s.Filter, &s.Status, &s.Cursor, &s.Bound, &s.InflightThrough)
	return s, err
}

// StartReplay marks request id running over the archive seqs in
// (cursor, bound], total events.
func (p *Postgres) StartReplay(ctx context.Context, db DB, id, cursor, bound, total int64) error {
	_, err := db.Exec(ctx, p.replay.start, id, cursor, bound, total)
	return err
}

// FailReplay marks request id failed with message.
func (p *Postgres) FailReplay(ctx context.Context, db DB, id int64, message string) error {
	_, err := db.Exec(ctx, p.replay.fail, id, message)
	return err
}

// MarkReplayInFlight records that request id's chunk through archive seq
// through is being handed to the sink.
func (p *Postgres) MarkReplayInFlight(ctx context.Context, db DB, id, through int64) error {
	_, err := db.Exec(ctx, p.replay.mark, id, through)
	return err
}

// ReplayAck moves request id's cursor to through, counts sent more events
// done and marks the request done at its bound. db must be fenced.
func (p *Postgres) ReplayAck(ctx context.Context, db DB, id, through int64, sent int) error {
	_, err := db.Exec(ctx, p.replay.ack, id, through, sent)
	return err
}

// QueueReplayAck queues ReplayAck.
func (p *Postgres) QueueReplayAck(b *pgx.Batch, id, through int64, sent int) {
	b.Queue(p.replay.ack, id, through, sent)
}

// ReplayChunk reads up to limit archived events with seq in (after,
// through] that match f, in seq order (StoredEvent.ID is the seq).
func (p *Postgres) ReplayChunk(ctx context.Context, db DB, after, through int64, f ArchiveFilter, limit int) ([]StoredEvent, error) {
	args := append([]any{after, through}, f.args()...)
	return collectStoredEvents(db.Query(ctx, p.replay.chunk, append(args, limit)...))
}

// ArchiveStartAtEvent returns the archive seq just before event eventID,
// nil when the archive does not hold it.
func (p *Postgres) ArchiveStartAtEvent(ctx context.Context, db DB, eventID string) (*int64, error) {
	var start *int64
	err := db.QueryRow(ctx, `SELECT min(seq) - 1 FROM `+p.ident("events_archive")+` WHERE event_id = $1::uuid`, eventID).Scan(&start)
	return start, err
}

// ArchiveStartSince returns the archive seq just before the first event
// created at or after since, nil when there is none.
func (p *Postgres) ArchiveStartSince(ctx context.Context, db DB, since time.Time) (*int64, error) {
	var start *int64
	err := db.QueryRow(ctx, `SELECT min(seq) - 1 FROM `+p.ident("events_archive")+` WHERE created_at >= $1`, since).Scan(&start)
	return start, err
}

// ArchiveTop returns the archive's highest seq, 0 when it is empty.
func (p *Postgres) ArchiveTop(ctx context.Context, db DB) (int64, error) {
	var top int64
	err := db.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+p.ident("events_archive")).Scan(&top)
	return top, err
}

// CountArchived counts the archived events with seq in (after, through]
// that match f.
func (p *Postgres) CountArchived(ctx context.Context, db DB, after, through int64, f ArchiveFilter) (int64, error) {
	var n int64
	args := append([]any{after, through}, f.args()...)
	err := db.QueryRow(ctx, `SELECT count(*) FROM `+p.ident("events_archive")+` WHERE seq > $1 AND seq <= $2`+archiveFilter, args...).Scan(&n)
	return n, err
}
