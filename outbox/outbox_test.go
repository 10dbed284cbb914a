package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup returns a migrated database: one connection for the writer and one
// for an outside observer.
func setup(t *testing.T, schema string) (writer, observer *pgx.Conn) {
	t.Helper()
	url, writer := pgtest.MigratedDatabase(t, schema)
	return writer, pgtest.Connect(t, url)
}

type row struct {
	topic   string
	key     *string
	payload []byte
	headers map[string]string
}

// end commits tx, or rolls it back.
func end(t *testing.T, tx pgx.Tx, commit bool) {
	t.Helper()
	finish := tx.Rollback
	if commit {
		finish = tx.Commit
	}
	if err := finish(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func readEvent(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, schema string, id uuid.UUID) (row, bool) {
	t.Helper()
	var r row
	err := q.QueryRow(context.Background(),
		"SELECT topic, key, payload, headers FROM "+pgx.Identifier{schema, "events"}.Sanitize()+" WHERE event_id = $1", id).
		Scan(&r.topic, &r.key, &r.payload, &r.headers)
	if err == pgx.ErrNoRows {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

func TestEmitFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, observer := setup(t, "outbox")

	for _, commit := range []bool{true, false} {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var id uuid.UUID
		if err := tx.QueryRow(ctx, `SELECT outbox.emit('orders', 'order-42', '{"status":"paid"}', '{"trace-id":"abc"}')`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		got, ok := readEvent(t, tx, "outbox", id)
		if !ok {
			t.Fatal("emitted row not visible inside its transaction")
		}
		if got.topic != "orders" || got.key == nil || *got.key != "order-42" || string(got.payload) != `{"status":"paid"}` || got.headers["trace-id"] != "abc" {
			t.Fatalf("row = %+v", got)
		}
		if _, ok := readEvent(t, observer, "outbox", id); ok {
			t.Fatal("uncommitted row visible outside its transaction")
		}
		end(t, tx, commit)
		if _, ok := readEvent(t, observer, "outbox", id); ok != commit {
			t.Fatalf("commit=%v: row visible afterwards = %v", commit, ok)
		}
	}

	// bytea payload, NULL key and a tombstone.
	var id uuid.UUID
	if err := writer.QueryRow(ctx, `SELECT outbox.emit('users', NULL, NULL::bytea)`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	got, ok := readEvent(t, observer, "outbox", id)
	if !ok || got.key != nil || got.payload != nil || got.headers != nil {
		t.Fatalf("tombstone row = %+v, found=%v; want NULL key, payload and headers", got, ok)
	}
}

func TestEmitHelper(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer, observer := setup(t, "billing")
	w := outbox.NewWriter("billing")
	events := []outbox.Event{
		{Topic: "invoices", Key: "inv-1", Payload: []byte("one"), Headers: map[string]string{"trace-id": "t1"}},
		{Topic: "invoices", Key: "", Payload: nil},
		{Topic: "invoices", Key: "inv-1", Payload: []byte("two")},
	}
	for _, commit := range []bool{true, false} {
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := w.Emit(ctx, tx, events...)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != len(events) {
			t.Fatalf("got %d ids for %d events", len(ids), len(events))
		}
		for i, id := range ids {
			got, ok := readEvent(t, tx, "billing", id)
			if !ok {
				t.Fatalf("event %d not visible inside its transaction", i)
			}
			want := events[i]
			if got.topic != want.Topic || string(got.payload) != string(want.Payload) || (got.payload == nil) != (want.Payload == nil) {
				t.Fatalf("event %d = %+v, want %+v", i, got, want)
			}
			if (want.Key == "") != (got.key == nil) || (got.key != nil && *got.key != want.Key) {
				t.Fatalf("event %d key = %v, want %q (empty means NULL)", i, got.key, want.Key)
			}
			wantH, _ := json.Marshal(want.Headers)
			gotH, _ := json.Marshal(got.headers)
			if string(wantH) != string(gotH) {
				t.Fatalf("event %d headers = %s, want %s", i, gotH, wantH)
			}
			if _, ok := readEvent(t, observer, "billing", id); ok {
				t.Fatal("uncommitted event visible outside its transaction")
			}
		}
		// The ordering id follows the order of the events given.
		var ordered bool
		if err := tx.QueryRow(ctx, `SELECT array_agg(event_id ORDER BY id) = $1::uuid[] FROM billing.events WHERE event_id = ANY($1)`, ids).Scan(&ordered); err != nil {
			t.Fatal(err)
		}
		if !ordered {
			t.Fatal("ordering ids do not follow the order of the events")
		}
		end(t, tx, commit)
		for _, id := range ids {
			if _, ok := readEvent(t, observer, "billing", id); ok != commit {
				t.Fatalf("commit=%v: event visible afterwards = %v", commit, ok)
			}
		}
	}
}

func TestEmitNeedsATransaction(t *testing.T) {
	if _, err := outbox.Emit(context.Background(), nil, outbox.Event{Topic: "t"}); err == nil {
		t.Fatal("Emit without a transaction succeeded")
	}
}
