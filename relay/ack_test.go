package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestAcknowledgementWaitsForVisibility: the WAL reader can hand over a
// transaction's events before the transaction is visible to other
// sessions. The acknowledgement must still remove every row, looking again
// until it sees them, and leave none behind in the outbox.
func TestAcknowledgementWaitsForVisibility(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	for _, retain := range []time.Duration{0, time.Hour} {
		var visible int64
		if err := conn.QueryRow(ctx, "INSERT INTO outbox.events (topic, payload) VALUES ('t', 'a') RETURNING id").Scan(&visible); err != nil {
			t.Fatal(err)
		}
		// A row whose transaction commits only after the acknowledgement
		// has started: invisible to the acknowledgement's first look.
		late := pgtest.Connect(t, url)
		lateTx, err := late.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var invisible int64
		if err := lateTx.QueryRow(ctx, "INSERT INTO outbox.events (topic, payload) VALUES ('t', 'b') RETURNING id").Scan(&invisible); err != nil {
			t.Fatal(err)
		}
		r, err := New(Config{DatabaseURL: url, Retain: retain, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.pool, err = r.connectPool(ctx); err != nil {
			t.Fatal(err)
		}
		committed := make(chan error, 1)
		go func() {
			time.Sleep(50 * time.Millisecond) // deliberate pause: holds the late transaction open so the acknowledgement meets it
			committed <- lateTx.Commit(ctx)
		}()
		ids := []int64{visible, invisible}
		// The migrated leadership row has epoch 0.
		l := &lease{epoch: 0}
		l.extend(time.Now(), time.Hour)
		err = r.commitAcks(ctx, []ack{{ids: ids, published: ids, count: 2, through: Position{Major: 1, Minor: uint64(invisible)}}}, l)
		r.pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := <-committed; err != nil {
			t.Fatal(err)
		}
		var left int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox.events").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Fatalf("retain=%v: %d acknowledged rows left in the outbox", retain, left)
		}
		if retain > 0 {
			var archived int
			conn.QueryRow(ctx, "SELECT count(*) FROM outbox.events_archive WHERE id = ANY($1)", ids).Scan(&archived)
			if archived != 2 {
				t.Fatalf("archived %d of 2 rows", archived)
			}
		}
	}
}
