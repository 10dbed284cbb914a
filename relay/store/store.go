package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what a statement runs on: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Postgres holds the statements of one outbox schema.
type Postgres struct {
	schema string
	core   coreSQL
	lease  leaseSQL
	holds  holdSQL
	replay replaySQL
}

// New returns the statements for the relay's tables in schema.
func New(schema string) *Postgres {
	ident := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	return &Postgres{
		schema: schema,
		core:   newCoreSQL(ident),
		lease:  newLeaseSQL(ident),
		holds:  newHoldSQL(ident),
		replay: newReplaySQL(ident),
	}
}

// Schema is the schema the statements name.
func (p *Postgres) Schema() string { return p.schema }

func (p *Postgres) ident(name string) string { return pgx.Identifier{p.schema, name}.Sanitize() }

// StoredEvent is an event kept in one of the relay's tables (the dead
// letters, the archive).
type StoredEvent struct {
	// ID is the row's own id: the dead letter's id, or the archive's
	// sequence number.
	ID int64
	// Row is the event's outbox row id.
	Row     int64
	EventID string
	Topic   string
	// Key, Payload and Headers are nil for NULL.
	Key, Payload, Headers []byte
	CreatedAt             time.Time
}

// scanStoredEvent reads a leading bigint (the row's id), the event's
// columns, then extra.
func scanStoredEvent(row pgx.Row, extra ...any) (StoredEvent, error) {
	var e StoredEvent
	var key, headers *string
	if err := row.Scan(append([]any{&e.ID, &e.Row, &e.EventID, &e.Topic, &key, &e.Payload, &headers, &e.CreatedAt}, extra...)...); err != nil {
		return e, err
	}
	e.Key, e.Headers = textBytes(key), textBytes(headers)
	return e, nil
}

// textBytes is the bytes of a text column scanned into s, nil for NULL.
func textBytes(s *string) []byte {
	if s == nil {
		return nil
	}
	return []byte(*s)
}

// collectRows reads every row of a query with scan, in order, and closes
// rows; it returns nil when there is none. err is the query's own error,
// returned as it is, so that a caller can hand over what db.Query
// returned.
func collectRows[T any](rows pgx.Rows, err error, scan func(pgx.Row) (T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// collectStoredEvents reads every row of a query of stored events (no
// extra columns).
func collectStoredEvents(rows pgx.Rows, err error) ([]StoredEvent, error) {
	return collectRows(rows, err, func(row pgx.Row) (StoredEvent, error) { return scanStoredEvent(row) })
}

// scanID reads a single id, reporting false when there is no row.
func scanID(row pgx.Row) (int64, bool, error) {
	var id int64
	err := row.Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	return id, true, nil
}
