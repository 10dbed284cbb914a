package store_test

// The conformance suite: every method of store.Postgres run against a
// migrated PostgreSQL (internal/pgtest), asserting its effect on the
// tables. The schema is not the default "outbox", so a statement that
// named a table without the schema would fail here.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay/store"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const schema = "store_conformance"

// fixture is one test's migrated database, a connection to it and the
// store's statements for it.
type fixture struct {
	t    *testing.T
	ctx  context.Context
	url  string
	conn *pgx.Conn
	s    *store.Postgres
}

func setup(t *testing.T) *fixture {
	t.Helper()
	url, conn := pgtest.MigratedDatabase(t, schema)
	return &fixture{t: t, ctx: context.Background(), url: url, conn: conn, s: store.New(schema)}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.conn.Exec(f.ctx, sql, args...); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
}

// int64s runs a query returning one bigint column.
func (f *fixture) int64s(sql string, args ...any) []int64 {
	f.t.Helper()
	rows, err := f.conn.Query(f.ctx, sql, args...)
	if err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return out
}

func (f *fixture) one(sql string, args ...any) int64 {
	f.t.Helper()
	v := f.int64s(sql, args...)
	if len(v) != 1 {
		f.t.Fatalf("%s: %d rows, want 1", sql, len(v))
	}
	return v[0]
}

// events inserts n outbox rows of topic (and key, when not nil) and
// returns their ids.
func (f *fixture) events(n int, topic string, key *string) []int64 {
	f.t.Helper()
	return f.int64s(`INSERT INTO `+schema+`.events (topic, key, payload, headers)
SELECT $1, $2, convert_to('p' || i, 'UTF8'), '{"h": "v"}' FROM generate_series(1, $3) AS i RETURNING id`, topic, key, n)
}

func (f *fixture) outboxIDs() []int64 {
	f.t.Helper()
	return f.int64s(`SELECT id FROM ` + schema + `.events ORDER BY id`)
}

// fenced runs fn in a transaction fenced by epoch 0 (the migrated
// leadership's) and commits it.
func (f *fixture) fenced(fn func(tx pgx.Tx) error) error {
	f.t.Helper()
	return pgx.BeginFunc(f.ctx, f.conn, func(tx pgx.Tx) error {
		held, err := f.s.Fence(f.ctx, tx, 0)
		if err != nil {
			return err
		}
		if !held {
			f.t.Fatal("epoch 0 does not lead the migrated schema")
		}
		return fn(tx)
	})
}

// send sends b in tx and reports the first statement's error.
func send(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	return tx.SendBatch(ctx, b).Close()
}

func ptr[T any](v T) *T { return &v }

// pgCode is the SQLSTATE of err, "" when it is no PostgreSQL error.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// ids returns the ID of each stored event.
func ids(es []store.StoredEvent) []int64 {
	out := []int64{}
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
