package store

// The statements of `relay status` (internal/cli/status.go): read-only,
// and bounded as the daemon's backlog sample is, so that asking for the
// status of a large outbox or archive does not scan it.

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExactCountLimit is where the status counts (and Backlog) stop counting
// rows one by one: a count above it is the planner's estimate of the
// table's size, or ExactCountLimit+1 when the estimate is lower.
const ExactCountLimit = 100000

// boundedCount is a scalar subquery counting table's rows exactly up to
// ExactCountLimit by walking its primary key key from the newest end,
// and taking the planner's estimate beyond that. Run it with sequential
// and bitmap scans off (see Backlog).
func boundedCount(ident func(string) string, table, key string) string {
	return `(SELECT CASE WHEN n <= ` + strconv.Itoa(ExactCountLimit) + ` THEN n
    ELSE greatest(n, (SELECT reltuples::bigint FROM pg_class WHERE oid = '` + ident(table) + `'::regclass)) END
FROM (SELECT count(*) AS n FROM (SELECT 1 FROM ` + ident(table) + ` ORDER BY ` + key + ` DESC LIMIT ` + strconv.Itoa(ExactCountLimit+1) + `) AS l) AS b)`
}

// pinIndexScans turns sequential and bitmap scans off for the rest of
// the transaction: a bounded count must walk the primary key.
const pinIndexScans = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)`

// Leadership is the leadership row and its lease, as `relay status`
// shows them.
type Leadership struct {
	Epoch  int64
	Holder string
	// Running: the lease is held and unexpired by the database's clock.
	Running bool
}

// ReadLeadership reads the current (or last) leader and whether its lease
// is unexpired.
func (p *Postgres) ReadLeadership(ctx context.Context, db DB) (Leadership, error) {
	var l Leadership
	err := db.QueryRow(ctx, `SELECT l.epoch, l.holder, NOT s.released AND s.renewed_at > now() - s.lease_ms * interval '1 millisecond'
FROM `+p.ident("leadership")+` l, `+p.ident("leader_lease")+` s`).Scan(&l.Epoch, &l.Holder, &l.Running)
	return l, err
}

// SavedCheckpoint is one row of <schema>.checkpoints.
type SavedCheckpoint struct {
	Name         string
	Source       string
	Major, Minor int64
	Published    int64
	UpdatedAt    time.Time
}

// ListCheckpoints reads every relay's checkpoint, by name.
func (p *Postgres) ListCheckpoints(ctx context.Context, db DB) ([]SavedCheckpoint, error) {
	rows, err := db.Query(ctx, `SELECT name, source, position_major, position_minor, published, updated_at FROM `+p.ident("checkpoints")+` ORDER BY name`)
	return collectRows(rows, err, func(row pgx.Row) (SavedCheckpoint, error) {
		var c SavedCheckpoint
		err := row.Scan(&c.Name, &c.Source, &c.Major, &c.Minor, &c.Published, &c.UpdatedAt)
		return c, err
	})
}

// Summary is the size of the outbox, its dead letters and its archive.
// Backlog, DeadLetters and Archived are bounded counts (ExactCountLimit).
type Summary struct {
	Backlog int64
	// OldestAge is the age of the oldest outbox row, 0 when there is none.
	OldestAge time.Duration
	// DeadLetters counts every dead letter, resolved or not.
	DeadLetters int64
	// HeldKeys and HeldEvents are CountHolds'.
	HeldKeys, HeldEvents int64
	Archived             int64
	// ArchiveOldest is when the archive's first event (lowest seq) was
	// published; nil when the archive is empty.
	ArchiveOldest *time.Time
}

// Summarize reads the Summary in one transaction; every part of it reads
// a bounded number of index entries (the held counts read the partial
// indexes of holding and held dead letters).
func (p *Postgres) Summarize(ctx context.Context, db DB) (Summary, error) {
	var s Summary
	q := `SELECT ` + boundedCount(p.ident, "events", "id") + `,
    coalesce((SELECT extract(epoch FROM now() - created_at)::float8 FROM ` + p.ident("events") + ` ORDER BY id LIMIT 1), 0),
    ` + boundedCount(p.ident, "dead_letters", "id") + `,
    ` + boundedCount(p.ident, "events_archive", "seq") + `,
    (SELECT published_at FROM ` + p.ident("events_archive") + ` ORDER BY seq LIMIT 1)`
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, pinIndexScans); err != nil {
			return err
		}
		var age float64
		if err := tx.QueryRow(ctx, q).Scan(&s.Backlog, &age, &s.DeadLetters, &s.Archived, &s.ArchiveOldest); err != nil {
			return err
		}
		s.OldestAge = time.Duration(age * float64(time.Second))
		return tx.QueryRow(ctx, p.holds.count).Scan(&s.HeldKeys, &s.HeldEvents)
	})
	return s, err
}

// SlotState is one of the relay's replication slots (those recorded in
// <schema>.cdc_slots) as pg_replication_slots shows it.
type SlotState struct {
	Name   string
	Active bool
	// LagBytes (to the confirmed flush position) and RetainedBytes (to
	// the restart position) are nil on a standby.
	LagBytes, RetainedBytes *int64
}

// ListSlots reads the relay's replication slots in the current database,
// by name.
func (p *Postgres) ListSlots(ctx context.Context, db DB) ([]SlotState, error) {
	rows, err := db.Query(ctx, `SELECT s.slot_name, s.active,
    CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint END,
    CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint END
FROM pg_replication_slots AS s JOIN `+p.ident("cdc_slots")+` AS c ON c.slot_name = s.slot_name
WHERE s.database = current_database() ORDER BY 1`)
	return collectRows(rows, err, func(row pgx.Row) (SlotState, error) {
		var s SlotState
		err := row.Scan(&s.Name, &s.Active, &s.LagBytes, &s.RetainedBytes)
		return s, err
	})
}
