package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// coreSQL are the statements of the acknowledgement, the checkpoint, the
// heartbeat and the backlog.
type coreSQL struct {
	deleteIDs, deleteRanges, dead, deadCopy, checkpoint, load, backlog, heartbeat string
}

func newCoreSQL(ident func(string) string) coreSQL {
	return coreSQL{
		deleteIDs: `DELETE FROM ` + ident("events") + ` WHERE id = ANY($1::bigint[])`,
		deleteRanges: `DELETE FROM ` + ident("events") + ` e USING unnest($1::bigint[], $2::bigint[]) AS r(lo, hi)
WHERE e.id BETWEEN r.lo AND r.hi`,
		dead: `INSERT INTO ` + ident("dead_letters") + ` (event_row_id, event_id, topic, key, payload, headers, created_at, error, reason, holds, held_by)
VALUES ($1, $2::uuid, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, $11)`,
		// deadCopy dead-letters an outbox row without its content
		// passing through the relay (relay/oversize.go).
		deadCopy: `INSERT INTO ` + ident("dead_letters") + ` (event_row_id, event_id, topic, key, payload, headers, created_at, error, reason, holds, held_by)
SELECT id, event_id, topic, key, payload, headers, created_at, $2, $3, $4, $5 FROM ` + ident("events") + ` WHERE id = $1`,
		checkpoint: `INSERT INTO ` + ident("checkpoints") + ` AS c (name, position_major, position_minor, sink_state, published, source, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, now())
ON CONFLICT (name) DO UPDATE SET position_major = $2, position_minor = $3, sink_state = $4,
    published = c.published + $5, source = $6, updated_at = now()`,
		load:      `SELECT position_major, position_minor, sink_state, source FROM ` + ident("checkpoints") + ` WHERE name = $1`,
		backlog:   `SELECT ` + boundedCount(ident, "events", "id"),
		heartbeat: `INSERT INTO ` + ident("events") + ` (topic, payload) VALUES ($1, $2)`,
	}
}

// Checkpoint is a relay's saved progress: the source position of the
// last acknowledged event, the sink's state and the kind of reader that
// wrote it.
type Checkpoint struct {
	Major, Minor int64
	State        []byte
	Source       string
}

// LoadCheckpoint reads the checkpoint of the relay called name; it
// reports false when there is none.
func (p *Postgres) LoadCheckpoint(ctx context.Context, db DB, name string) (Checkpoint, bool, error) {
	var ck Checkpoint
	err := db.QueryRow(ctx, p.core.load, name).Scan(&ck.Major, &ck.Minor, &ck.State, &ck.Source)
	if errors.Is(err, pgx.ErrNoRows) {
		return Checkpoint{}, false, nil
	}
	return ck, err == nil, err
}

// QueueCheckpoint queues the save of name's checkpoint, adding published
// to its count of published events.
func (p *Postgres) QueueCheckpoint(b *pgx.Batch, name string, ck Checkpoint, published int) {
	b.Queue(p.core.checkpoint, name, ck.Major, ck.Minor, ck.State, published, ck.Source)
}

// DeleteRanges deletes the outbox rows with ids in [lo[i], hi[i]] and
// returns how many it deleted. tx must be fenced.
func (p *Postgres) DeleteRanges(ctx context.Context, tx DB, lo, hi []int64) (int64, error) {
	tag, err := tx.Exec(ctx, p.core.deleteRanges, lo, hi)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// DeleteIDs deletes the outbox rows with the given ids and returns how
// many it deleted. tx must be fenced.
func (p *Postgres) DeleteIDs(ctx context.Context, tx DB, ids []int64) (int64, error) {
	tag, err := tx.Exec(ctx, p.core.deleteIDs, ids)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// DeadLetterRow is a dead letter as the acknowledgement records it.
type DeadLetterRow struct {
	Row       int64
	EventID   string
	Topic     string
	Key       *string
	Payload   []byte
	Headers   *string
	CreatedAt time.Time
	Error     string
	Reason    string
	// Holds: the dead letter holds its key; HeldBy: the event is held
	// behind the dead letter of that outbox row.
	Holds  bool
	HeldBy *int64
}

func (d DeadLetterRow) args() []any {
	return []any{d.Row, d.EventID, d.Topic, d.Key, d.Payload, d.Headers, d.CreatedAt, d.Error, d.Reason, d.Holds, d.HeldBy}
}

// InsertDeadLetter records d.
func (p *Postgres) InsertDeadLetter(ctx context.Context, db DB, d DeadLetterRow) error {
	_, err := db.Exec(ctx, p.core.dead, d.args()...)
	return err
}

// QueueDeadLetter queues the record of d.
func (p *Postgres) QueueDeadLetter(b *pgx.Batch, d DeadLetterRow) {
	b.Queue(p.core.dead, d.args()...)
}

// CopyDeadLetter dead-letters outbox row d.Row with its content as the
// outbox holds it (d's event columns are not used); it reports false when
// the row is not in the outbox.
func (p *Postgres) CopyDeadLetter(ctx context.Context, db DB, d DeadLetterRow) (bool, error) {
	tag, err := db.Exec(ctx, p.core.deadCopy, d.Row, d.Error, d.Reason, d.Holds, d.HeldBy)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() > 0, nil
}

// InsertHeartbeat writes a heartbeat row into the outbox.
func (p *Postgres) InsertHeartbeat(ctx context.Context, db DB, topic string, payload []byte) error {
	_, err := db.Exec(ctx, p.core.heartbeat, topic, payload)
	return err
}

// Backlog counts the outbox's rows exactly up to 100,000 and takes the
// planner's estimate beyond that.
//
// It counts from the newest row down the primary key. The acknowledgement
// deletes the oldest rows, and until a vacuum they stay in the table: a
// scan in table order read all of their pages first at every sample, and
// checked each newly deleted row (989 ms of the server's time for one
// sample in a drain of a million rows). From the newest end the count
// stops at 100,001 while the backlog is larger, and below that it passes
// each deleted row's index entry once: the scan marks the entries of rows
// dead to everyone, and later scans skip them without reading the table.
// The plan is pinned for the transaction (no sequential or bitmap scan):
// the outbox's statistics describe a passing moment, and planned from a
// nearly empty table the count would scan and sort the whole of it. Given
// a transaction, Backlog leaves those two settings off until it ends.
func (p *Postgres) Backlog(ctx context.Context, db DB) (int64, error) {
	var n int64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pinIndexScans); err != nil {
			return err
		}
		return tx.QueryRow(ctx, p.core.backlog).Scan(&n)
	})
	return n, err
}
