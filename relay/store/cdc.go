package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// CDCReader holds the WAL reader's statements for one schema: the
// preflight, the replication slot's state, the slot's creation record in
// <schema>.cdc_slots, the read of the table after a slot's creation, the
// slot's lag and the heartbeat. LSNs and snapshots go in and come out as
// their text forms.
type CDCReader struct {
	schema string
	q      cdcSQL
}

// NewCDCReader returns the WAL reader's statements for schema.
func NewCDCReader(schema string) *CDCReader {
	return &CDCReader{schema: schema, q: newCDCSQL(schema)}
}

// nullText is "" for NULL.
func nullText(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// WALLevel returns the server's wal_level.
func (c *CDCReader) WALLevel(ctx context.Context, db DB) (string, error) {
	var level string
	err := db.QueryRow(ctx, c.q.walLevel).Scan(&level)
	return level, err
}

// Role returns the current role's name and whether it is a superuser and
// may replicate.
func (c *CDCReader) Role(ctx context.Context, db DB) (name string, super, replication bool, err error) {
	err = db.QueryRow(ctx, c.q.role).Scan(&name, &super, &replication)
	return name, super, replication, err
}

// OutboxExists reports whether <schema>.events exists.
func (c *CDCReader) OutboxExists(ctx context.Context, db DB) (bool, error) {
	var exists bool
	err := db.QueryRow(ctx, c.q.outboxExists, c.q.table).Scan(&exists)
	return exists, err
}

// Publication is what a publication publishes of the outbox.
type Publication struct {
	// Inserts: it publishes inserts.
	Inserts bool
	// Covers: <schema>.events is among its tables.
	Covers bool
}

// Publication reads the publication pub; found is false when there is
// none.
func (c *CDCReader) Publication(ctx context.Context, db DB, pub string) (p Publication, found bool, err error) {
	err = db.QueryRow(ctx, c.q.publication, pub, c.schema).Scan(&p.Inserts, &p.Covers)
	if errors.Is(err, pgx.ErrNoRows) {
		return Publication{}, false, nil
	}
	return p, err == nil, err
}

// CreatePublication creates the publication pub of the outbox table's
// inserts. pub goes into the statement unquoted: the caller allows only
// lower-case letters, digits and underscores.
func (c *CDCReader) CreatePublication(ctx context.Context, db DB, pub string) error {
	_, err := db.Exec(ctx, c.q.createPublication(pub))
	return err
}

// ReplicationSlot is a slot's row in pg_replication_slots; a NULL column
// reads as "" or 0.
type ReplicationSlot struct {
	Plugin, Type, Database string
	ActivePID              int32
	WALStatus              string
	// ConfirmedFlush is confirmed_flush_lsn as text.
	ConfirmedFlush string
}

// Slot reads the replication slot name; found is false when there is
// none.
func (c *CDCReader) Slot(ctx context.Context, db DB, name string) (st ReplicationSlot, found bool, err error) {
	var plugin, database, walStatus, confirmed *string
	var pid *int32
	err = db.QueryRow(ctx, c.q.slot, name).Scan(&plugin, &st.Type, &database, &pid, &walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return ReplicationSlot{}, false, nil
	}
	if err != nil {
		return ReplicationSlot{}, false, err
	}
	st.Plugin, st.Database, st.WALStatus, st.ConfirmedFlush = nullText(plugin), nullText(database), nullText(walStatus), nullText(confirmed)
	if pid != nil {
		st.ActivePID = *pid
	}
	return st, true, nil
}

// SlotCount returns how many replication slots the cluster has and how
// many it allows (max_replication_slots).
func (c *CDCReader) SlotCount(ctx context.Context, db DB) (used, limit int, err error) {
	err = db.QueryRow(ctx, c.q.slotCount).Scan(&used, &limit)
	return used, limit, err
}

// SlotNameFacts returns the current database's oid and whether a slot
// named legacy exists in it.
func (c *CDCReader) SlotNameFacts(ctx context.Context, db DB, legacy string) (oid uint32, legacyHere bool, err error) {
	err = db.QueryRow(ctx, c.q.slotNameFacts, legacy).Scan(&oid, &legacyHere)
	return oid, legacyHere, err
}

// Database returns current_database().
func (c *CDCReader) Database(ctx context.Context, db DB) (string, error) {
	var name string
	err := db.QueryRow(ctx, c.q.database).Scan(&name)
	return name, err
}

// DropSlot drops the replication slot name.
func (c *CDCReader) DropSlot(ctx context.Context, db DB, name string) error {
	_, err := db.Exec(ctx, c.q.dropSlot, name)
	return err
}

// SlotLag returns how many bytes of WAL the server's current position is
// past the slot's confirmed flush position (lag) and past its restart
// position (retained), 0 for NULL; found is false when there is no slot.
func (c *CDCReader) SlotLag(ctx context.Context, db DB, slot string) (lag, retained int64, found bool, err error) {
	var l, r *int64
	err = db.QueryRow(ctx, c.q.lag, slot).Scan(&l, &r)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, false, nil
	}
	if err != nil {
		return 0, 0, false, err
	}
	if l != nil {
		lag = *l
	}
	if r != nil {
		retained = *r
	}
	return lag, retained, true, nil
}

// Heartbeat writes a non-transactional logical message, which moves the
// slot's stream along while the outbox is idle.
func (c *CDCReader) Heartbeat(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, c.q.heartbeat)
	return err
}

// SlotMark is a slot's creation record in <schema>.cdc_slots:
// ConsistentLSN and Snapshot as text, "" for NULL.
type SlotMark struct {
	ConsistentLSN, Snapshot string
}

// Mark reads slot's creation record; found is false when there is none.
// The error of a schema without cdc_slots is PostgreSQL's (42P01).
func (c *CDCReader) Mark(ctx context.Context, db DB, slot string) (m SlotMark, found bool, err error) {
	var lsn, snap *string
	err = db.QueryRow(ctx, c.q.mark, slot).Scan(&lsn, &snap)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotMark{}, false, nil
	}
	if err != nil {
		return SlotMark{}, false, err
	}
	return SlotMark{ConsistentLSN: nullText(lsn), Snapshot: nullText(snap)}, true, nil
}

// BeginMark records that slot is being created: its record without a
// position, replacing any earlier one.
func (c *CDCReader) BeginMark(ctx context.Context, db DB, slot string) error {
	_, err := db.Exec(ctx, c.q.beginMark, slot)
	return err
}

// CompleteMark records the consistent point lsn and the snapshot of
// slot's creation.
func (c *CDCReader) CompleteMark(ctx context.Context, db DB, slot, lsn, snapshot string) error {
	_, err := db.Exec(ctx, c.q.completeMark, slot, lsn, snapshot)
	return err
}

// MarkTableRead clears the snapshot of slot's record when its consistent
// point is still lsn: the table's rows from before it are published.
func (c *CDCReader) MarkTableRead(ctx context.Context, db DB, slot, lsn string) error {
	_, err := db.Exec(ctx, c.q.markRead, slot, lsn)
	return err
}

// DeleteMark deletes slot's record.
func (c *CDCReader) DeleteMark(ctx context.Context, db DB, slot string) error {
	_, err := db.Exec(ctx, c.q.deleteMark, slot)
	return err
}

// ImportSnapshot makes tx see the snapshot a slot's creation exported
// under name, and returns it as pg_current_snapshot() text. tx must be a
// REPEATABLE READ transaction that has run nothing yet.
func (c *CDCReader) ImportSnapshot(ctx context.Context, tx DB, name string) (string, error) {
	if _, err := tx.Exec(ctx, importSnapshot(name)); err != nil {
		return "", err
	}
	var snap string
	err := tx.QueryRow(ctx, c.q.currentSnapshot).Scan(&snap)
	return snap, err
}

// RowsLeft reports whether an outbox row's transaction is visible in
// snapshot.
func (c *CDCReader) RowsLeft(ctx context.Context, db DB, snapshot string) (bool, error) {
	var left bool
	err := db.QueryRow(ctx, c.q.rowsLeft, snapshot).Scan(&left)
	return left, err
}

// TableRow is an outbox row read from the table, with its writing
// transaction's id as text.
type TableRow struct {
	ID             int64
	Txid           string
	EventID, Topic string
	Key, Payload   []byte
	Headers        []byte
	CreatedAt      time.Time
}

// ReadTablePage returns up to CDCTablePage outbox rows whose transaction
// is visible in snapshot, after (afterTxid, afterID), in (txid, id)
// order. Key and Headers are nil for NULL.
func (c *CDCReader) ReadTablePage(ctx context.Context, db DB, snapshot, afterTxid string, afterID int64) ([]TableRow, error) {
	rows, err := db.Query(ctx, c.q.tablePage, snapshot, afterTxid, afterID)
	return collectRows(rows, err, func(row pgx.Row) (TableRow, error) {
		var r TableRow
		var key, headers *string
		if err := row.Scan(&r.ID, &r.Txid, &r.EventID, &r.Topic, &key, &r.Payload, &headers, &r.CreatedAt); err != nil {
			return r, err
		}
		r.Key, r.Headers = textBytes(key), textBytes(headers)
		return r, nil
	})
}
