package cdc_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay"
)

// Rows written before the slot existed are published from the table, and
// a transaction still open while the slot is created arrives exactly once.
func TestRowsBeforeTheSlotComeFromTheTable(t *testing.T) {
	t.Parallel()
	f := setup(t)
	insertN(t, f.url, 1, 10)
	ctx := context.Background()
	tx := f.openTx(t, "k2", "11")
	// Creating the slot waits for the open transaction.
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		time.Sleep(500 * time.Millisecond) // deliberate pause: holds the transaction open while the slot is created
		tx.Commit(ctx)
	}()
	// The event may arrive before Commit returns: wait for it before the
	// deferred Close touches the connection.
	defer func() { <-committed }()
	_, c := f.startCore(t, relay.Position{})
	insertN(t, f.url, 12, 5)
	got := c.collect(16, 20*time.Second)
	c.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, got, 16)
	waitFor(t, 10*time.Second, "the table read to be marked done", func() bool {
		var n int
		f.conn.QueryRow(ctx, "SELECT count(*) FROM outbox.cdc_slots WHERE consistent_lsn IS NOT NULL AND snapshot IS NULL").Scan(&n)
		return n == 1
	})
}

// A source closed in the middle of publishing rows from the table resumes
// them after a restart, without repeating the acknowledged ones.
func TestRestartDuringTableRead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	insertN(t, f.url, 1, 30)
	src, c := f.startCore(t, relay.Position{})
	c.max = 10
	first := append([]relay.Event(nil), c.collect(10, 20*time.Second)...)
	src.Close(context.Background())
	from := c.acked

	insertN(t, f.url, 31, 5)
	_, c2 := f.startCore(t, from)
	rest := c2.collect(25, 20*time.Second)
	c2.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, append(first, rest...), 35)
}

// dropSlot ends the walsender streaming the slot and drops the slot,
// retrying while the source reconnects in between.
func dropSlot(t *testing.T, url, slot string) {
	t.Helper()
	admin := pgtest.Connect(t, url)
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
		_, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dropping slot %s: %v", slot, err)
		}
	}
}

// The slot dropped under a running source: events in flight are
// acknowledged, rows written while no slot existed come from the table,
// and streaming resumes from a new slot, with nothing lost or repeated.
func TestSlotDroppedWhileStreaming(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src, c := f.startCore(t, relay.Position{})
	ctx := context.Background()
	insertN(t, f.url, 1, 10)
	c.collect(10, 20*time.Second)
	insertN(t, f.url, 11, 5)
	inflight, err := src.Next(ctx, 100)
	if err != nil || len(inflight) != 5 {
		t.Fatalf("Next = %d events, %v", len(inflight), err)
	}

	dropSlot(t, f.url, f.cfg.SlotName)
	insertN(t, f.url, 16, 5)
	time.Sleep(300 * time.Millisecond) // deliberate pause: lets the reader meet the dropped slot before the held batch is delivered
	// The sink finishes the batch it held when the slot went.
	c.deliver(ctx, inflight)
	got := c.collect(20, 30*time.Second)
	insertN(t, f.url, 21, 5)
	got = c.collect(25, 30*time.Second)
	c.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, got, 25)
	var n int
	if err := f.conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.cfg.SlotName).Scan(&n); err != nil || n != 1 {
		t.Fatalf("slot count %d, %v", n, err)
	}
}

// A slot dropped while the relay was down is recreated by Start, and the
// rows still in the table are published.
func TestSlotDroppedWhileStopped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src, c := f.startCore(t, relay.Position{})
	insertN(t, f.url, 1, 10)
	first := append([]relay.Event(nil), c.collect(10, 20*time.Second)...)
	src.Close(context.Background())
	insertN(t, f.url, 11, 10)
	dropSlot(t, f.url, f.cfg.SlotName)

	_, c2 := f.startCore(t, c.acked)
	rest := c2.collect(10, 20*time.Second)
	insertN(t, f.url, 21, 5)
	rest = c2.collect(15, 20*time.Second)
	c2.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, append(first, rest...), 25)
}

// PostgreSQL restarted (as after a crash) in the middle of the stream:
// the source reconnects and nothing is lost or repeated. Not parallel: it
// restarts the shared server.
func TestPostgresRestartMidStream(t *testing.T) {
	f := setup(t)
	_, c := f.startCore(t, relay.Position{})
	c.max = 50
	insertN(t, f.url, 1, 200)
	c.collect(100, 20*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pgtest.Cluster(t).Restart(ctx, true); err != nil {
		t.Fatal(err)
	}
	insertN(t, f.url, 201, 100)
	got := c.collect(300, 60*time.Second)
	c.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, got, 300)
}

// The server invalidates the slot (wal_status = 'lost') while events are
// delivered but not yet acknowledged: the source recovers from the table
// and resumes on a new slot. Runs on its own cluster, which keeps at most
// 1MB of WAL for slots.
func TestSlotInvalidatedWhileStreaming(t *testing.T) {
	t.Parallel()
	cluster, admin := migratedCluster(t, map[string]string{"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0"})
	url := cluster.URL()
	f := &fixture{url: url, conn: admin, cfg: cdc.Config{
		DatabaseURL:       url,
		SlotName:          "relay_outbox",
		HeartbeatInterval: 200 * time.Millisecond,
		StatusInterval:    100 * time.Millisecond,
		Logger:            testLogger(t),
	}}
	src, c := f.startCore(t, relay.Position{})
	ctx := context.Background()
	insertN(t, url, 1, 10)
	c.collect(10, 20*time.Second)
	insertN(t, url, 11, 5)
	inflight, err := src.Next(ctx, 100)
	if err != nil || len(inflight) != 5 {
		t.Fatalf("Next = %d events, %v", len(inflight), err)
	}

	f.exec(t, "CREATE TABLE churn (x text)")
	waitFor(t, 60*time.Second, "the slot to be invalidated", func() bool {
		f.exec(t, "INSERT INTO churn SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
		f.exec(t, "SELECT pg_switch_wal()")
		f.exec(t, "CHECKPOINT")
		var status *string
		admin.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", "relay_outbox").Scan(&status)
		return status == nil || *status == "lost"
	})
	insertN(t, url, 16, 5)
	c.deliver(ctx, inflight)
	got := c.collect(20, 30*time.Second)
	insertN(t, url, 21, 5)
	got = c.collect(25, 30*time.Second)
	c.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, got, 25)
	var status string
	if err := admin.QueryRow(ctx, "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'relay_outbox'").Scan(&status); err != nil || status == "lost" {
		t.Fatalf("slot after recovery: %q, %v", status, err)
	}
}

// A slot of the right name that the relay did not create (no record of
// its creation) cannot tell which rows are older than it: Start replaces
// it and publishes the table.
func TestForeignSlotIsReplaced(t *testing.T) {
	t.Parallel()
	f := setup(t)
	insertN(t, f.url, 1, 5)
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.cfg.SlotName)
	insertN(t, f.url, 6, 5)
	_, c := f.startCore(t, relay.Position{})
	insertN(t, f.url, 11, 5)
	got := c.collect(15, 20*time.Second)
	c.quiet(500 * time.Millisecond)
	checkExactlyOnce(t, got, 15)
}
