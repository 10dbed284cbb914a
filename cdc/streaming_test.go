package cdc_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay"
)

// The streaming tests lower logical_decoding_work_mem to 64 kB for the
// test's database, so the walsender streams any transaction of more than
// a few hundred events, and check pg_stat_replication_slots to know it
// did: a test that passed with nothing streamed would prove nothing.

// streamingSetup is setup with a database whose walsenders stream early,
// the source's memory bound at 64 kB and its spill files in a directory
// of the test.
func streamingSetup(t *testing.T) *fixture {
	t.Helper()
	f := setup(t)
	streamEarly(t, f.conn)
	f.cfg.StreamMemoryBytes = 64 << 10
	f.cfg.SpillDir = t.TempDir()
	return f
}

// streamEarly lowers logical_decoding_work_mem to 64 kB for conn's
// database: its walsenders (those started from now on) stream any
// transaction of more than a few hundred events.
func streamEarly(t testing.TB, conn *pgx.Conn) {
	t.Helper()
	sql := fmt.Sprintf("ALTER DATABASE %s SET logical_decoding_work_mem = '64kB'", pgx.Identifier{conn.Config().Database}.Sanitize())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// slotStats reads the slot's streaming and spilling counters, waiting
// until stream_txns reaches atLeast (the statistics reach the view a
// little after the walsender counted them).
func slotStats(t *testing.T, conn *pgx.Conn, slot string, atLeast int64) (streamTxns, streamBytes, spillBytes int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := conn.QueryRow(context.Background(),
			"SELECT stream_txns, stream_bytes, spill_bytes FROM pg_stat_replication_slots WHERE slot_name = $1", slot).
			Scan(&streamTxns, &streamBytes, &spillBytes)
		if err != nil && err != pgx.ErrNoRows {
			t.Fatal(err)
		}
		if streamTxns >= atLeast || time.Now().After(deadline) {
			return streamTxns, streamBytes, spillBytes
		}
		time.Sleep(100 * time.Millisecond) // condition poll: replication slot statistics
	}
}

// requireStreamed fails the test unless the slot streamed at least n
// transactions.
func requireStreamed(t *testing.T, conn *pgx.Conn, slot string, n int64) {
	t.Helper()
	txns, bytes, spill := slotStats(t, conn, slot, n)
	if txns < n || bytes == 0 {
		t.Fatalf("slot %s streamed %d transactions (%d bytes), want at least %d: the test did not exercise streaming", slot, txns, bytes, n)
	}
	t.Logf("slot %s: stream_txns %d, stream_bytes %d, spill_bytes %d", slot, txns, bytes, spill)
}

// spillFiles counts the files in dir.
func spillFiles(t *testing.T, dir string) int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(entries)
}

// A streamed transaction is published once, whole, in commit order
// between the transactions before and after it, at the positions the
// transaction sent whole gets, and nothing of it before it commits, even
// while it has spilled to disk; its spill file is gone after the commit.
func TestStreamedTransactionPublishedOnceInOrder(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	// A torn spill file of an earlier process: removed, never read.
	leftover := f.cfg.SpillDir + "/xid-42.stream"
	if err := os.WriteFile(leftover, []byte{0x80}, 0o600); err != nil {
		t.Fatal(err)
	}
	_, c := f.startCore(t, relay.Position{})
	waitFor(t, 10*time.Second, "the leftover spill file's removal", func() bool {
		_, err := os.Stat(leftover)
		return os.IsNotExist(err)
	})
	const n = 20_000
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('before')")
	c.collect(1, 30*time.Second)

	ctx := context.Background()
	tx := f.openTx(t, "k0", "0")
	if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) SELECT 't', 'k' || (g % 3), convert_to(g::text, 'UTF8') FROM generate_series(1, $1) AS g", n); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a spill file of the open transaction", func() bool { return spillFiles(t, f.cfg.SpillDir) > 0 })
	c.quiet(500 * time.Millisecond)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('after')")
	got := c.collect(n+3, 60*time.Second)
	if got[0].Topic != "before" || got[n+2].Topic != "after" {
		t.Fatalf("first %q, last %q", got[0].Topic, got[n+2].Topic)
	}
	big := got[1 : n+2]
	if string(big[0].Payload) != "0" {
		t.Fatalf("first event of the streamed transaction: %+v", big[0])
	}
	checkExactlyOnce(t, big[1:], n)
	for i, e := range big {
		if e.Position.Major != big[0].Position.Major || e.Position.Minor != uint64(i) || e.CommittedAt.IsZero() || e.EventID == "" {
			t.Fatalf("event %d of the streamed transaction: %+v", i, e)
		}
	}
	c.quiet(300 * time.Millisecond)
	if k := spillFiles(t, f.cfg.SpillDir); k != 0 {
		t.Fatalf("%d spill files left after the commit", k)
	}
	requireStreamed(t, f.conn, f.cfg.SlotName, 1)
}

// A streamed transaction that rolls back publishes nothing and leaves no
// spill file.
func TestStreamedAbortPublishesNothing(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	_, c := f.startCore(t, relay.Position{})
	ctx := context.Background()
	tx := f.openTx(t, "gone", "0")
	if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, payload) SELECT 'gone', convert_to(g::text, 'UTF8') FROM generate_series(1, 10000) AS g"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a spill file of the open transaction", func() bool { return spillFiles(t, f.cfg.SpillDir) > 0 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('after')")
	got := c.collect(1, 30*time.Second)
	if got[0].Topic != "after" {
		t.Fatalf("got %+v", got[0])
	}
	c.quiet(500 * time.Millisecond)
	waitFor(t, 10*time.Second, "the spill file's removal", func() bool { return spillFiles(t, f.cfg.SpillDir) == 0 })
	requireStreamed(t, f.conn, f.cfg.SlotName, 1)
}

// Rolled-back savepoints of a streamed transaction, nested, released and
// not, large enough to have been streamed and spilled before their abort,
// publish nothing; the rest of the transaction is published with the same
// events at the same positions as a reader of protocol version 1 (a
// second slot on the same database) publishes it.
func TestStreamedSubtransactionAbort(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	_, c := f.startCore(t, relay.Position{})
	v1cfg := f.cfg
	v1cfg.SlotName += "_v1"
	v1cfg.NoStreaming = true
	v1, err := cdc.New(v1cfg)
	if err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := v1.Start(startCtx, relay.Position{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v1.Close(context.Background()) })

	ctx := context.Background()
	conn := pgtest.Connect(t, f.url)
	const part = 2000
	seq := 0
	kept := 0
	insert := func(keep bool) {
		t.Helper()
		topic := "drop"
		if keep {
			topic = "keep"
			kept += part
		}
		if _, err := conn.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) SELECT $1, 'k' || (g % 3), convert_to(g::text, 'UTF8') FROM generate_series($2::int, $3::int) AS g",
			topic, seq+1, seq+part); err != nil {
			t.Fatal(err)
		}
		seq += part
	}
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("BEGIN")
	insert(true)
	exec("SAVEPOINT a")
	insert(false)
	exec("ROLLBACK TO SAVEPOINT a")
	insert(true)
	exec("SAVEPOINT b")
	insert(true)
	exec("RELEASE SAVEPOINT b")
	exec("SAVEPOINT c")
	insert(false)
	exec("SAVEPOINT d")
	insert(false)
	exec("RELEASE SAVEPOINT d")
	insert(false)
	exec("ROLLBACK TO SAVEPOINT c")
	exec("SAVEPOINT e")
	insert(true)
	exec("SAVEPOINT f")
	insert(false)
	exec("ROLLBACK TO SAVEPOINT f")
	insert(true)
	exec("RELEASE SAVEPOINT e")
	exec("COMMIT")
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('after')")

	got := c.collect(kept+1, 60*time.Second)
	c.quiet(500 * time.Millisecond)
	if got[kept].Topic != "after" {
		t.Fatalf("last event %+v", got[kept])
	}
	for i, e := range got[:kept] {
		if e.Topic != "keep" || e.Position.Major != got[0].Position.Major || e.Position.Minor != uint64(i) {
			t.Fatalf("event %d: topic %q at %v", i, e.Topic, e.Position)
		}
	}
	checkNoneTwice(t, got)

	// The protocol 1 reader, given the same database, publishes the same.
	var want []relay.Event
	readCtx, cancelRead := context.WithTimeout(ctx, 60*time.Second)
	defer cancelRead()
	for len(want) < kept+1 {
		events, err := v1.Next(readCtx, 1000)
		if err != nil {
			t.Fatalf("protocol 1 reader after %d events: %v", len(want), err)
		}
		want = append(want, events...)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Position != w.Position || g.EventID != w.EventID || g.ID != w.ID || string(g.Payload) != string(w.Payload) ||
			!g.CommittedAt.Equal(w.CommittedAt) || !g.CreatedAt.Equal(w.CreatedAt) {
			t.Fatalf("event %d: streamed %+v, protocol 1 %+v", i, g, w)
		}
	}
	requireStreamed(t, f.conn, f.cfg.SlotName, 1)
	if txns, _, _ := slotStats(t, f.conn, v1cfg.SlotName, 0); txns != 0 {
		t.Fatalf("the protocol 1 slot streamed %d transactions", txns)
	}
}

// Several large transactions written at once, their chunks interleaved
// on the stream, are each published whole in commit order; the one that
// rolls back publishes nothing.
func TestInterleavedStreamedTransactions(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	_, c := f.startCore(t, relay.Position{})
	ctx := context.Background()
	const writers, rounds, perRound = 4, 6, 400
	txs := make([]pgx.Tx, writers)
	for w := range txs {
		txs[w] = f.openTx(t, fmt.Sprint("w", w), "0")
	}
	for r := range rounds {
		for w, tx := range txs {
			from := r*perRound + 1
			if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) SELECT $1, 'w' || $1, convert_to(g::text, 'UTF8') FROM generate_series($2::int, $3::int) AS g",
				fmt.Sprint(w), from, from+perRound-1); err != nil {
				t.Fatal(err)
			}
		}
	}
	order := []int{2, 0, 3}
	for _, w := range order {
		if err := txs[w].Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := txs[1].Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	per := rounds*perRound + 1
	got := c.collect(len(order)*per, 60*time.Second)
	c.quiet(500 * time.Millisecond)
	checkOrder(t, got)
	for i, w := range order {
		block := got[i*per : (i+1)*per]
		for j, e := range block {
			if e.Topic != fmt.Sprint(w) && !(j == 0 && e.Topic == "t") {
				t.Fatalf("transaction %d of the commit order (writer %d), event %d: topic %q", i, w, j, e.Topic)
			}
			if e.Position.Major != block[0].Position.Major || e.Position.Minor != uint64(j) {
				t.Fatalf("writer %d event %d at %v", w, j, e.Position)
			}
		}
	}
	requireStreamed(t, f.conn, f.cfg.SlotName, 3)
}

// A spill directory that cannot be made fails the spill; the reader then
// reconnects with protocol version 1 and publishes the transaction once.
func TestStreamingSpillFailureFallsBack(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	f.cfg.SpillDir = "/dev/null/spill"
	src, c := f.startCore(t, relay.Position{})
	const n = 10_000
	insertN(t, f.url, 1, n)
	got := c.collect(n, 60*time.Second)
	checkExactlyOnce(t, got, n)
	c.quiet(500 * time.Millisecond)
	// A spill was tried, so the transaction was streamed (the slot's
	// statistics may miss a chunk cut off by the disconnection).
	if k := cdc.SpillFailures(src); k != 1 {
		t.Fatalf("%d sessions ended by a failed spill, want 1", k)
	}
}

// While a streamed transaction is open, the heartbeats' positions do not
// move the slot's confirmed flush position past it; once it committed and
// was acknowledged, the flush position moves past its commit.
func TestNoConfirmPastOpenStreamedTransaction(t *testing.T) {
	t.Parallel()
	f := streamingSetup(t)
	_, c := f.startCore(t, relay.Position{})
	f.exec(t, "INSERT INTO outbox.events (topic) VALUES ('before')")
	c.collect(1, 30*time.Second)
	ctx := context.Background()
	tx := f.openTx(t, "k", "0")
	if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, payload) SELECT 'big', convert_to(g::text, 'UTF8') FROM generate_series(1, 10000) AS g"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "a spill file of the open transaction", func() bool { return spillFiles(t, f.cfg.SpillDir) > 0 })
	var inTx uint64
	if err := f.conn.QueryRow(ctx, "SELECT (pg_current_wal_lsn() - '0/0')::numeric::bigint").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	// Heartbeats every 200 ms, status updates every 100 ms: without the
	// open transaction the flush position would pass inTx at once.
	time.Sleep(1500 * time.Millisecond) // deliberate pause: many heartbeats and status updates, which must not move the flush position (a negative check)
	if flush := slotFlush(t, f.conn, f.cfg.SlotName); flush >= inTx {
		t.Fatalf("confirmed flush %d is past the open streamed transaction's changes (%d)", flush, inTx)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := c.collect(1+10001, 60*time.Second)
	end := got[len(got)-1].Position.Major
	waitFor(t, 10*time.Second, "the flush position past the commit", func() bool { return slotFlush(t, f.conn, f.cfg.SlotName) > end })
	requireStreamed(t, f.conn, f.cfg.SlotName, 1)
}
