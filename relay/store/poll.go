package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PollReader holds the poll reader's statements for one schema and
// message limit (the limit is built into the statements' text: a row
// above it is read without its content).
type PollReader struct {
	schema string
	q      pollSQL
	// events is the outbox table's quoted name, the sleep lock's argument.
	events string
}

// NewPollReader returns the poll reader's statements for schema, reading
// rows above maxMessageBytes (key, payload and headers as JSON text)
// without their content.
func NewPollReader(schema string, maxMessageBytes int64) *PollReader {
	return &PollReader{schema: schema, q: newPollSQL(schema, maxMessageBytes), events: pgx.Identifier{schema, "events"}.Sanitize()}
}

// MessagesSlot returns a replication slot of this outbox's WAL reader, in
// this database, to which emit_message wrote logical messages (migration
// 012 marks its cdc_slots row); it reports false when there is none.
func (p *PollReader) MessagesSlot(ctx context.Context, db DB) (string, bool, error) {
	var slot string
	err := db.QueryRow(ctx, `SELECT c.slot_name FROM `+pgx.Identifier{p.schema, "cdc_slots"}.Sanitize()+` AS c
JOIN pg_replication_slots AS s ON s.slot_name = c.slot_name AND s.database = current_database()
WHERE c.messages LIMIT 1`).Scan(&slot)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return slot, err == nil, err
}

// PrepareSession sets the reading connection's session up for the
// reader's statements and reports whether the server tracks commit
// timestamps.
func (p *PollReader) PrepareSession(ctx context.Context, db DB) (byTS bool, err error) {
	// A tick matters only until its batch is acknowledged, and the core's
	// acknowledgement commits synchronously, which flushes the tick's
	// commit record before its own: recording a tick need not wait for a
	// flush of its own.
	if _, err := db.Exec(ctx, `SET synchronous_commit = off`); err != nil {
		return false, fmt.Errorf("setting synchronous_commit: %w", err)
	}
	// The outbox is a queue: its statistics describe a passing moment
	// (nearly empty at the first ANALYZE, then full of deleted rows until
	// a vacuum), and a prepared statement keeps the generic plan made from
	// them for the connection's life. Planned on an empty table, the live
	// read scanned the whole outbox three times per read (milliseconds,
	// seen with auto_explain under relay bench). Every statement of the
	// reader is meant as an index lookup or an index-ordered scan, so its
	// connection does not plan sequential scans.
	if _, err := db.Exec(ctx, `SET enable_seqscan = off`); err != nil {
		return false, fmt.Errorf("setting enable_seqscan: %w", err)
	}
	// With sequential scans priced out, a plan that must sort the whole
	// batch (the commit-timestamp order of a first or large batch) costs
	// above every JIT threshold, and the server compiled it at each read:
	// 0.9 s of inlining and optimization for a 171-row batch, seen with
	// auto_explain as a one-second stall in relay bench's live p99. The
	// reader's statements are index lookups that JIT cannot speed up.
	if _, err := db.Exec(ctx, `SET jit = off`); err != nil {
		return false, fmt.Errorf("setting jit: %w", err)
	}
	if err := db.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp')::bool`).Scan(&byTS); err != nil {
		return false, fmt.Errorf("reading track_commit_timestamp: %w", err)
	}
	return byTS, nil
}

// Listen makes db receive a notification at each commit of outbox rows
// (migration 001's trigger).
func (p *PollReader) Listen(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, "LISTEN "+pgx.Identifier{p.schema + ".events"}.Sanitize())
	return err
}

// sleepKey is the advisory lock key the reader holds while it sleeps and
// a writing statement takes shared (migration 013): 0x52454c41 in the high
// 32 bits, the outbox table's oid in the low ones. Its one argument is the
// table's quoted name.
const sleepKey = `(1380273217::bigint << 32) | $1::regclass::oid::bigint`

// Sleep takes the reader's sleep lock for db's session, when no writing
// transaction holds it shared, and reports whether it did. While db holds
// it, every statement that inserts outbox rows notifies at commit.
func (p *PollReader) Sleep(ctx context.Context, db DB) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT pg_catalog.pg_try_advisory_lock(`+sleepKey+`)`, p.events).Scan(&ok)
	return ok, err
}

// Wake releases the sleep lock Sleep took: writers stop notifying.
func (p *PollReader) Wake(ctx context.Context, db DB) error {
	var ok bool
	if err := db.QueryRow(ctx, `SELECT pg_catalog.pg_advisory_unlock(`+sleepKey+`)`, p.events).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return errors.New("the reader's sleep lock was not held")
	}
	return nil
}

// Tick is a recorded tick: its number, its snapshot, and whether its
// batch is ordered by commit timestamp.
type Tick struct {
	N        int64
	Snapshot string
	ByTS     bool
}

// MaxTick returns the highest recorded tick, 0 when none is.
func (p *PollReader) MaxTick(ctx context.Context, db DB) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, p.q.maxTick).Scan(&n)
	return n, err
}

// LoadTicks returns the recorded ticks from tick from on, in order.
func (p *PollReader) LoadTicks(ctx context.Context, db DB, from int64) ([]Tick, error) {
	rows, err := db.Query(ctx, p.q.loadTicks, from)
	return collectRows(rows, err, func(row pgx.Row) (Tick, error) {
		var t Tick
		err := row.Scan(&t.N, &t.Snapshot, &t.ByTS)
		return t, err
	})
}

// ClearTicks deletes every recorded tick.
func (p *PollReader) ClearTicks(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, p.q.clearTicks)
	return err
}

// PruneTicks deletes the recorded ticks before tick below.
func (p *PollReader) PruneTicks(ctx context.Context, db DB, below int64) error {
	_, err := db.Exec(ctx, p.q.prune, below)
	return err
}

// PageRow is an outbox row as a page read returns it.
type PageRow struct {
	// Snapshot is set on the first row of a fresh read: the new tick's
	// snapshot.
	Snapshot *string
	ID       int64
	EventID  string
	Topic    string
	// Key, Payload and Headers are nil for NULL, and for a row above the
	// message limit (the key comes when it alone is within the limit).
	Key       *string
	Payload   []byte
	Headers   *string
	CreatedAt time.Time
	// Size is the row's key, payload and headers (as JSON text) in bytes.
	Size int64
	// CommitKey and Txid are the commit-timestamp order's sort key, in
	// reads by commit timestamp.
	CommitKey int64
	Txid      string
}

// eachRow scans the rows of a page read into PageRows and hands them to
// each, in order, until each returns false; the rest of the statement is
// then read and dropped, never held, so that an error anywhere in it (and
// a fresh read's tick record) counts.
func eachRow(rows pgx.Rows, err error, fresh, byTS bool, each func(PageRow) bool) error {
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var r PageRow
		dest := make([]any, 0, 11)
		if fresh {
			dest = append(dest, &r.Snapshot)
		}
		dest = append(dest, &r.ID, &r.EventID, &r.Topic, &r.Key, &r.Payload, &r.Headers, &r.CreatedAt, &r.Size)
		if byTS {
			dest = append(dest, &r.CommitKey, &r.Txid)
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		if !each(r) {
			break
		}
	}
	rows.Close()
	return rows.Err()
}

// ReadFresh takes a snapshot and reads the first page, up to limit rows,
// of the batch of rows visible in it and not in prev (every visible row
// when prev is nil, in a scan of the primary key), in row-id or
// commit-timestamp order (byTS). In the same statement it records the
// snapshot as tick when the page has rows, and deletes the ticks before
// prune.
func (p *PollReader) ReadFresh(ctx context.Context, db DB, byTS bool, prev *string, limit int, tick, prune int64, each func(PageRow) bool) error {
	scan := prev == nil
	var rows pgx.Rows
	var err error
	if byTS {
		rows, err = db.Query(ctx, p.q.freshTS(scan), prev, limit, tick, prune)
	} else {
		rows, err = db.Query(ctx, p.q.freshID(scan), prev, int64(0), limit, tick, prune)
	}
	return eachRow(rows, err, true, byTS, each)
}

// ReadIDPage reads up to limit rows visible in snap and not in prev with
// ids above after, in row-id order. first is the first page of a batch
// with a prev, read through prev's running transactions; the others scan
// the primary key from after.
func (p *PollReader) ReadIDPage(ctx context.Context, db DB, first bool, prev *string, snap string, after int64, limit int, each func(PageRow) bool) error {
	sql := p.q.scanID
	if first {
		sql = p.q.firstID
	}
	rows, err := db.Query(ctx, sql, prev, snap, after, limit)
	return eachRow(rows, err, false, false, each)
}

// ReadFirstTSPage reads up to limit rows visible in snap and not in prev,
// in commit-timestamp order.
func (p *PollReader) ReadFirstTSPage(ctx context.Context, db DB, prev *string, snap string, limit int, each func(PageRow) bool) error {
	rows, err := db.Query(ctx, p.q.firstTS, prev, snap, limit)
	return eachRow(rows, err, false, true, each)
}

// ListTS returns the ids and sizes of the rows visible in snap and not in
// prev (every visible row when prev is nil) after (lastKey, lastTxid,
// lastID), in commit-timestamp order.
func (p *PollReader) ListTS(ctx context.Context, db DB, prev *string, snap string, lastKey int64, lastTxid string, lastID int64) (ids, sizes []int64, err error) {
	sql := p.q.keysDelta
	if prev == nil {
		sql = p.q.keysAll
	}
	rows, err := db.Query(ctx, sql, prev, snap, lastKey, lastTxid, lastID)
	if err != nil {
		return nil, nil, err
	}
	var id, sz int64
	_, err = pgx.ForEachRow(rows, []any{&id, &sz}, func() error {
		ids, sizes = append(ids, id), append(sizes, sz)
		return nil
	})
	return ids, sizes, err
}

// Fetch reads the outbox rows ids, in no particular order; a row not in
// the outbox is left out.
func (p *PollReader) Fetch(ctx context.Context, db DB, ids []int64, each func(PageRow)) error {
	rows, err := db.Query(ctx, p.q.fetch, ids)
	return eachRow(rows, err, false, false, func(r PageRow) bool { each(r); return true })
}
