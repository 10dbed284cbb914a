package cdc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// The end-to-end tests run the real binary with --source cdc against the
// package's cluster, kill it with SIGKILL, restart PostgreSQL under it and
// drop its slot, and check the embedded log against what the writers
// committed: every committed event exactly once, each key's events in
// commit order, nothing rolled back.

// TestE2ECrashLoopExactlyOnce: 8 writers commit 100,000 events over 1,000
// keys (one transaction in 25 rolls back) while the relay, reading the
// WAL, is SIGKILLed at random moments at least 10 times, every third time
// while its acknowledgements are held back so that the restarted relay
// finds events in the log that its slot sends again.
func TestE2ECrashLoopExactlyOnce(t *testing.T) {
	env := newRelayEnv(t)
	ctx, relay, ledger, writeDone := env.underLoad(5*time.Minute, 100_000)

	skips := 0
	loop := env.killLoop(rand.NewPCG(3, 4), 10, [2]time.Duration{100 * time.Millisecond, 700 * time.Millisecond})
	loop.Killed = func(p *e2e.Proc) { skips += strings.Count(p.Output(), "skipped re-delivered events") }
	loop.More = e2e.MoreOf(e2e.CrashLoad(env.url, 0, 1000), 400, ledger)
	relay, kills, held := loop.Run(t, ctx, relay, writeDone)
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	skips += strings.Count(relay.Output(), "skipped re-delivered events")
	n := e2e.CheckLog(t, env.dataDir, ledger)
	if skips == 0 {
		t.Errorf("no restarted relay skipped re-delivered events: the kills never landed between the log's fsync and the acknowledgement")
	}
	t.Logf("%d events exactly once in per-key order through %d SIGKILLs (%d with acknowledgements held back; %d times a restarted relay skipped re-delivered events); %d rolled-back events absent",
		n, kills, held, skips, len(ledger.RolledBack))
}

// resilientWrite is e2e.Write for a server that goes away: each writer
// reconnects and retries a transaction that failed, and resolves a COMMIT
// whose outcome it did not learn by looking for the transaction's row in
// e2e_txs (a business row written in the same transaction, which the relay
// never deletes) before recording it as committed or not.
func resilientWrite(ctx context.Context, cfg e2e.WriterConfig, ledger *e2e.Ledger, retries *int64) error {
	var mu sync.Mutex // guards retries
	return e2e.EachWriter(cfg, func(w, n int) error {
		return resilientWriter(ctx, cfg, w, n, ledger, &mu, retries)
	})
}

func resilientWriter(ctx context.Context, cfg e2e.WriterConfig, w, n int, ledger *e2e.Ledger, mu *sync.Mutex, retries *int64) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	connect := func() error {
		if conn != nil {
			conn.Close(ctx)
			conn = nil
		}
		for {
			c, err := pgx.Connect(ctx, cfg.URL)
			if err == nil {
				conn = c
				return nil
			}
			if ctx.Err() != nil {
				return err
			}
			time.Sleep(100 * time.Millisecond) // retry backoff: reconnecting while PostgreSQL restarts
		}
	}
	if err := connect(); err != nil {
		return err
	}
	gen := e2e.NewTxGen(cfg, w, 7, nil)
	for txNo, written := 1, 0; written < n; txNo++ {
		txID := fmt.Sprintf("w%d-t%d", w, txNo)
		wt := gen.Next(txNo, txID, n-written)
		committed, err := func() (bool, error) {
			for attempt := 0; ; attempt++ {
				if attempt > 0 {
					mu.Lock()
					*retries++
					mu.Unlock()
					if attempt > 600 {
						return false, errors.New("gave up after 600 attempts")
					}
					time.Sleep(100 * time.Millisecond) // retry backoff: reconnecting while PostgreSQL restarts
					if err := connect(); err != nil {
						return false, err
					}
				}
				tx, err := conn.Begin(ctx)
				if err != nil {
					continue
				}
				if err := gen.Insert(ctx, tx, wt); err != nil {
					tx.Rollback(ctx)
					continue
				}
				if _, err := tx.Exec(ctx, "INSERT INTO e2e_txs (id) VALUES ($1)", txID); err != nil {
					tx.Rollback(ctx)
					continue
				}
				if wt.Rollback {
					if err := tx.Rollback(ctx); err != nil {
						continue // the server went away: the transaction is gone either way
					}
					return false, nil
				}
				if err := tx.Commit(ctx); err == nil {
					return true, nil
				}
				// The outcome is unknown: ask, on a new connection.
				for {
					if ctx.Err() != nil {
						return false, ctx.Err()
					}
					if err := connect(); err != nil {
						return false, err
					}
					var exists bool
					if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM e2e_txs WHERE id = $1)", txID).Scan(&exists); err == nil {
						if exists {
							return true, nil
						}
						break // not committed: retry it
					}
					time.Sleep(100 * time.Millisecond) // retry backoff: asking again whether the transaction committed
				}
			}
		}()
		if err != nil {
			return err
		}
		ledger.Note(wt.Payloads, committed)
		if committed {
			gen.Committed(wt)
			written += len(wt.Payloads)
		}
	}
	return nil
}

// TestE2EPostgresRestartMidStream restarts PostgreSQL in immediate mode
// (as a crash would) twice while 8 writers commit and the relay streams.
// The writers reconnect and resolve their in-doubt commits; the relay
// reconnects; the log holds every committed event exactly once in per-key
// order. Not parallel: it restarts the package's server.
func TestE2EPostgresRestartMidStream(t *testing.T) { postgresRestartMidStream(t, 10, false) }

// postgresRestartMidStream is TestE2EPostgresRestartMidStream with writer
// transactions of up to perTx events, and, with streaming, a server that
// streams those past 64 kB.
func postgresRestartMidStream(t *testing.T, perTx int, streaming bool) {
	env := newRelayEnv(t)
	conn := pgtest.Connect(t, env.url)
	if _, err := conn.Exec(context.Background(), "CREATE TABLE e2e_txs (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if streaming {
		streamEarly(t, conn)
	}
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	relay := env.start()
	// The restarts are for a relay that streams: one still starting
	// would only retry its start-up (a CI run restarted the server twice
	// before the relay's first read of the slot, and it never reconnected).
	waitFor(t, 2*time.Minute, "the relay streaming from its slot", func() bool {
		return strings.Contains(relay.Output(), "streaming from the replication slot")
	})
	var retries int64
	writeDone := make(chan error, 1)
	go func() {
		writeDone <- resilientWrite(ctx, e2e.WriterConfig{
			URL: env.url, Schema: "outbox", Topic: "orders", Writers: 8, Events: 30_000, Keys: 1000,
			PerTx: perTx, RollbackEvery: 25, PayloadBytes: 120,
		}, ledger, &retries)
	}()
	restarts := 0
	for _, after := range []int64{3000, 12000} {
		if streaming {
			// Large transactions commit fast and publish after: restart
			// while the writers are still at it, their transactions
			// streaming.
			waitFor(t, time.Minute, "the writers' progress", func() bool { return int64(ledger.Len()) >= after })
		} else {
			e2e.WaitPublished(t, env.url, after, time.Minute)
		}
		if err := pgtest.Cluster(t).Restart(ctx, true); err != nil {
			t.Fatal(err)
		}
		restarts++
	}
	if err := <-writeDone; err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	out := relay.Output()
	if !strings.Contains(out, "reconnecting") && !strings.Contains(out, "relay pipeline stopped; restarting") {
		t.Errorf("the relay's log shows no reconnection")
	}
	n := e2e.CheckLog(t, env.dataDir, ledger)
	if retries == 0 {
		t.Errorf("no writer transaction was retried: the restarts missed the writers")
	}
	if streaming {
		requireStreamed(t, pgtest.Connect(t, env.url), env.slot, 1)
	}
	t.Logf("%d events exactly once in per-key order through %d immediate restarts of PostgreSQL; writers retried %d times",
		n, restarts, retries)
}

// TestE2EHundredThousandEventTransaction publishes one transaction of
// 100,000 events, between smaller ones, with the relay SIGKILLed twice
// while it is part way through the big one.
func TestE2EHundredThousandEventTransaction(t *testing.T) {
	env := newRelayEnv(t)
	conn := pgtest.Connect(t, env.url)
	ledger := e2e.NewLedger()
	ctx := context.Background()
	// small writes n events in one transaction with IDs prefix-i on keys
	// key-(i % 1000); big keeps per-key seq after the small ones.
	seq := map[string]int{}
	write := func(prefix string, n int) {
		t.Helper()
		var ks, bodies []string
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("key-%d", i%1000)
			p := e2e.Payload{ID: fmt.Sprintf("%s-%d", prefix, i), Key: k, Seq: seq[k]}
			seq[k]++
			ledger.Committed[p.ID] = p
			body, _ := json.Marshal(p)
			ks, bodies = append(ks, k), append(bodies, string(body))
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers)
SELECT 'orders', k, convert_to(p, 'UTF8'), '{"test":"e2e"}' FROM unnest($1::text[], $2::text[]) AS e(k, p)`, ks, bodies); err != nil {
			t.Fatal(err)
		}
	}
	relay := env.start()
	write("before", 500)
	e2e.WaitPublished(t, env.url, 500, time.Minute)
	write("big", 100_000)
	write("after", 500)
	for _, at := range []int64{20_000, 60_000} {
		e2e.WaitPublished(t, env.url, 500+at, 2*time.Minute)
		relay.Kill()
		relay = env.start()
	}
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	records := e2e.ReadLog(t, env.dataDir, "orders")
	n := e2e.Check(t, records, ledger)
	if n != 101_000 {
		t.Fatalf("the log has %d records, want 101000", n)
	}
	t.Logf("a 100,000-event transaction published whole and exactly once, between two others, through 2 SIGKILLs in its middle")
}

// TestE2EIdleOutboxSlotAdvances: the outbox is idle while another table is
// busy; heartbeats let the slot's confirmed_flush_lsn follow the server's
// WAL, so the slot does not pin it, and the slot-lag gauge shows it.
func TestE2EIdleOutboxSlotAdvances(t *testing.T) {
	env := newRelayEnv(t)
	conn := pgtest.Connect(t, env.url)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "CREATE TABLE busy (id bigserial PRIMARY KEY, body text)"); err != nil {
		t.Fatal(err)
	}
	relay := env.start("--heartbeat-interval", "100ms")
	// One event, so the relay is known to stream.
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', 'k', '{"id":"first","key":"k","seq":0}', '{"test":"e2e"}')`); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, env.url, "outbox", time.Minute)
	confirmed := func() (flush, current uint64) {
		t.Helper()
		err := conn.QueryRow(ctx, `SELECT (confirmed_flush_lsn - '0/0')::numeric::bigint, (pg_current_wal_lsn() - '0/0')::numeric::bigint
FROM pg_replication_slots WHERE slot_name = $1`, env.slot).Scan(&flush, &current)
		if err != nil {
			t.Fatal(err)
		}
		return flush, current
	}
	start, _ := confirmed()
	var target uint64
	advances := 0
	last := start
	busyUntil := time.Now().Add(3 * time.Second)
	for time.Now().Before(busyUntil) {
		if _, err := conn.Exec(ctx, "INSERT INTO busy (body) SELECT repeat('x', 500) FROM generate_series(1, 200)"); err != nil {
			t.Fatal(err)
		}
		f, cur := confirmed()
		if f > last {
			advances++
			last = f
		}
		target = cur
		time.Sleep(20 * time.Millisecond) // condition poll: samples the slot's confirmed position
	}
	var flush uint64
	waitFor(t, 10*time.Second, "the slot's confirmed_flush_lsn to pass the busy table's WAL", func() bool {
		flush, _ = confirmed()
		return flush >= target
	})
	if advances < 3 {
		t.Errorf("confirmed_flush_lsn moved only %d times while the other table was busy", advances)
	}
	// The gauge reports the small lag.
	lag := e2e.Metric(t, env.addr, "relay_cdc_slot_lag_bytes")
	if lag < 0 || lag > 1<<20 {
		t.Errorf("relay_cdc_slot_lag_bytes = %v after the slot caught up", lag)
	}
	relay.Stop(time.Minute)
	t.Logf("idle outbox, busy other table: confirmed_flush_lsn advanced %d times while writing, %d bytes in all, up to the last write (%d); slot lag gauge %v bytes",
		advances, flush-start, target, lag)
}

// TestE2ESlotDroppedUnderTheRelay: while writers commit, the slot's
// walsender is terminated and the slot dropped, twice. The relay says so
// loudly, publishes the rows not yet published from the table, recreates
// the slot and resumes; nothing is lost or duplicated.
func TestE2ESlotDroppedUnderTheRelay(t *testing.T) {
	env := newRelayEnv(t)
	ctx, relay, ledger, writeDone := env.underLoad(3*time.Minute, 30_000)
	admin := pgtest.Connect(t, env.url)
	drops := 0
	for _, after := range []int64{3000, 12000} {
		e2e.WaitPublished(t, env.url, after, time.Minute)
		dropSlot(t, env.url, env.slot)
		drops++
		// Wait for the new slot before the next drop.
		waitFor(t, time.Minute, "the relay to recreate its slot", func() bool {
			var n int
			admin.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active", env.slot).Scan(&n)
			return n == 1
		})
	}
	if err := <-writeDone; err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	if got := strings.Count(relay.Output(), "REPLICATION SLOT LOST"); got < drops {
		t.Errorf("the relay reported %d slot losses for %d drops", got, drops)
	}
	n := e2e.CheckLog(t, env.dataDir, ledger)
	t.Logf("%d events exactly once in per-key order; the slot was dropped under the relay %d times and recovered from the table", n, drops)
}
