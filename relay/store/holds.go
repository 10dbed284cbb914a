package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// holdSQL are the statements of holds and releases (relay/hold.go,
// relay/release.go).
type holdSQL struct {
	load, count, pick, holder, held, heldRows, republished, released, retryFailed, newHolder, moveHeld, done string
}

func newHoldSQL(ident func(string) string) holdSQL {
	dl := ident("dead_letters")
	cols := `id, event_row_id, event_id::text, topic, key, payload, headers::text, created_at`
	return holdSQL{
		load: `SELECT DISTINCT ON (topic, key) topic, key, event_row_id FROM ` + dl + ` WHERE holds AND key IS NOT NULL ORDER BY topic, key, id DESC`,
		count: `SELECT count(DISTINCT (topic, key)) FILTER (WHERE holds), count(*) FILTER (WHERE held_by IS NOT NULL AND resolution IS NULL)
FROM ` + dl + ` WHERE holds OR (held_by IS NOT NULL AND resolution IS NULL)`,
		// A holding dead letter retried or discarded: to release.
		pick:   `SELECT id FROM ` + dl + ` WHERE holds AND resolution IS NOT NULL ORDER BY id LIMIT 1`,
		holder: `SELECT ` + cols + `, holds, coalesce(resolution, ''), republished_at IS NULL FROM ` + dl + ` WHERE id = $1`,
		held:   `SELECT ` + cols + ` FROM ` + dl + ` WHERE held_by = $1 AND resolution IS NULL ORDER BY id LIMIT $2`,
		// The holder of a key, after a release step.
		heldRows:    `SELECT coalesce((SELECT event_row_id FROM ` + dl + ` WHERE holds AND topic = $1 AND key = $2 ORDER BY id DESC LIMIT 1), 0)`,
		republished: `UPDATE ` + dl + ` SET republished_at = now() WHERE id = $1`,
		released:    `UPDATE ` + dl + ` SET resolution = 'released', resolved_at = now() WHERE id = ANY($1::bigint[]) AND resolution IS NULL`,
		retryFailed: `UPDATE ` + dl + ` SET resolution = NULL, resolved_at = NULL, failed_at = now(), reason = $2, error = $3 WHERE id = $1`,
		newHolder:   `UPDATE ` + dl + ` SET holds = true, held_by = NULL, failed_at = now(), reason = $2, error = $3 WHERE id = $1`,
		moveHeld:    `UPDATE ` + dl + ` SET held_by = $2 WHERE held_by = $1 AND resolution IS NULL AND id <> $3`,
		done: `UPDATE ` + dl + ` SET holds = false WHERE id = $1 AND resolution IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM ` + dl + ` WHERE held_by = $2 AND resolution IS NULL)`,
	}
}

// Hold is a held key and the outbox row id of the dead letter holding it
// (the newest, when several do).
type Hold struct {
	Topic, Key string
	Row        int64
}

// LoadHolds reads every held key.
func (p *Postgres) LoadHolds(ctx context.Context, db DB) ([]Hold, error) {
	rows, err := db.Query(ctx, p.holds.load)
	return collectRows(rows, err, func(row pgx.Row) (Hold, error) {
		var h Hold
		err := row.Scan(&h.Topic, &h.Key, &h.Row)
		return h, err
	})
}

// CountHolds counts the held keys and the events held behind them.
func (p *Postgres) CountHolds(ctx context.Context, db DB) (keys, events int64, err error) {
	err = db.QueryRow(ctx, p.holds.count).Scan(&keys, &events)
	return keys, events, err
}

// PickRelease returns the oldest holding dead letter that was retried or
// discarded (its key is to be released); it reports false when there is
// none.
func (p *Postgres) PickRelease(ctx context.Context, db DB) (int64, bool, error) {
	return scanID(db.QueryRow(ctx, p.holds.pick))
}

// Holder is a dead letter being released.
type Holder struct {
	Event StoredEvent
	// Holds: it still holds its key; Resolution: '' while unresolved;
	// Fresh: its retried event has not been republished yet.
	Holds      bool
	Resolution string
	Fresh      bool
}

// ReadHolder reads dead letter id.
func (p *Postgres) ReadHolder(ctx context.Context, db DB, id int64) (Holder, error) {
	var h Holder
	var err error
	h.Event, err = scanStoredEvent(db.QueryRow(ctx, p.holds.holder, id), &h.Holds, &h.Resolution, &h.Fresh)
	return h, err
}

// KeyHolder returns the outbox row id of the newest dead letter that
// holds (topic, key), 0 when none does.
func (p *Postgres) KeyHolder(ctx context.Context, db DB, topic, key string) (int64, error) {
	var row int64
	err := db.QueryRow(ctx, p.holds.heldRows, topic, key).Scan(&row)
	return row, err
}

// HeldEvents returns up to limit unresolved events held behind the dead
// letter of outbox row holderRow, in their order.
func (p *Postgres) HeldEvents(ctx context.Context, db DB, holderRow int64, limit int) ([]StoredEvent, error) {
	return collectStoredEvents(db.Query(ctx, p.holds.held, holderRow, limit))
}

// QueueRepublished records that dead letter id's retried event was
// published again.
func (p *Postgres) QueueRepublished(b *pgx.Batch, id int64) {
	b.Queue(p.holds.republished, id)
}

// QueueRetryFailed puts retried dead letter id back to unresolved, with
// the reason and error of its new failure.
func (p *Postgres) QueueRetryFailed(b *pgx.Batch, id int64, reason, errText string) {
	b.Queue(p.holds.retryFailed, id, reason, errText)
}

// QueueReleased marks the unresolved held events ids released.
func (p *Postgres) QueueReleased(b *pgx.Batch, ids []int64) {
	b.Queue(p.holds.released, ids)
}

// QueueNewHolder makes held event id a dead letter holding its key, with
// the reason and error of its failure.
func (p *Postgres) QueueNewHolder(b *pgx.Batch, id int64, reason, errText string) {
	b.Queue(p.holds.newHolder, id, reason, errText)
}

// QueueMoveHeld moves the unresolved events held behind outbox row
// fromRow, except dead letter exceptID, behind outbox row toRow.
func (p *Postgres) QueueMoveHeld(b *pgx.Batch, fromRow, toRow, exceptID int64) {
	b.Queue(p.holds.moveHeld, fromRow, toRow, exceptID)
}

// QueueReleaseDone clears holds on resolved dead letter holderID once no
// unresolved event is held behind its outbox row holderRow.
func (p *Postgres) QueueReleaseDone(b *pgx.Batch, holderID, holderRow int64) {
	b.Queue(p.holds.done, holderID, holderRow)
}
