package cdc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay"
)

// nextXid is the transaction id the next transaction will get.
func nextXid(t *testing.T, conn *pgx.Conn) uint64 {
	t.Helper()
	var x uint64
	if err := conn.QueryRow(context.Background(), "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&x); err != nil {
		t.Fatal(err)
	}
	return x
}

// burnXidsTo consumes transaction ids until the next one is at least to.
func burnXidsTo(t *testing.T, conn *pgx.Conn, to uint64) {
	t.Helper()
	for {
		n := nextXid(t, conn)
		if n >= to {
			return
		}
		if _, err := conn.Exec(context.Background(), fmt.Sprintf(
			"DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$", to-n)); err != nil {
			t.Fatal(err)
		}
	}
}

// The table read after a slot creation pages through the outbox in
// (txid, id) order. Transaction ids that cross a power of ten ("9999",
// "10000") sort differently as text: ordering by the text form repeated
// some rows, skipped others and broke per-key order. Here two
// transactions of 1,500 events each straddle such a boundary, with a key
// written by both, and must be read whole, once, and in order.
func TestTableReadAcrossXidDigitBoundary(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	boundary := uint64(10)
	for boundary <= nextXid(t, f.conn)+2 {
		boundary *= 10
	}
	burnXidsTo(t, f.conn, boundary-1)
	const perTx = 1500
	insert := func(tag string) uint64 {
		t.Helper()
		var xid uint64
		err := pgx.BeginFunc(ctx, f.conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 't', 'k' || (g % 7), convert_to($1 || '-' || g, 'UTF8') FROM generate_series(1, $2::int) AS g`, tag, perTx); err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid)
		})
		if err != nil {
			t.Fatal(err)
		}
		return xid
	}
	x1 := insert("a")
	burnXidsTo(t, f.conn, boundary)
	x2 := insert("b")
	if len(fmt.Sprint(x1)) == len(fmt.Sprint(x2)) {
		t.Fatalf("transactions %d and %d do not straddle a power of ten", x1, x2)
	}
	t.Logf("writing transactions %d and %d", x1, x2)

	// Both committed before the slot exists: they come from the table.
	_, c := f.startCore(t, relay.Position{})
	got := c.collect(2*perTx, 30*time.Second)
	c.quiet(500 * time.Millisecond)
	checkOrder(t, got)
	want := []string{}
	for _, tag := range []string{"a", "b"} {
		for g := 1; g <= perTx; g++ {
			want = append(want, fmt.Sprintf("%s-%d", tag, g))
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d events from the table, want %d", len(got), len(want))
	}
	for i, e := range got {
		if string(e.Payload) != want[i] {
			t.Fatalf("event %d is %s, want %s: the table read is not in (txid, id) order", i, e.Payload, want[i])
		}
	}
}
