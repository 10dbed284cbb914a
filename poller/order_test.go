package poller_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// orderCase is a reader and a cluster to run an ordering test against.
type orderCase struct {
	name, source string
	commitTS     bool
}

var orderCases = []orderCase{
	{"poll", "poll", false},
	{"poll-commit-timestamps", "poll", true},
	{"cdc", "cdc", false},
}

func (c orderCase) database(t *testing.T) (url, bin string) {
	t.Helper()
	if c.commitTS {
		url = pgtest.CommitTimestampDatabase(t)
		return url, e2e.MigrateURL(t, url)
	}
	return e2e.Migrated(t)
}

// TestTwoTransactionsCommitOrder is the case the transaction-id order got
// wrong: T2 takes a transaction id first (by writing elsewhere), T1 starts,
// locks the business row, writes its event and commits; T2 then locks the
// row, writes its event and commits. T1's event must come first in the
// log. Five keys go through this before the relay starts (both events in
// its first batch) and five while it runs.
func TestTwoTransactionsCommitOrder(t *testing.T) {
	for _, c := range orderCases {
		t.Run(c.name, func(t *testing.T) {
			url, bin := c.database(t)
			dataDir := e2e.DataDir(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := e2e.SetupLocked(ctx, url, 10); err != nil {
				t.Fatal(err)
			}
			ledger := e2e.NewLedger()
			c1, c2 := pgtest.Connect(t, url), pgtest.Connect(t, url)
			scenario := func(k int) {
				t.Helper()
				key := fmt.Sprintf("hot-%d", k)
				t2, err := c2.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer t2.Rollback(ctx)
				var x2, x1 uint64
				if _, err := t2.Exec(ctx, `INSERT INTO public.relay_test_elsewhere (n) VALUES (2)`); err != nil {
					t.Fatal(err)
				}
				if err := t2.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x2); err != nil {
					t.Fatal(err)
				}
				t1, err := c1.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer t1.Rollback(ctx)
				p1, err := e2e.LockedTx(ctx, t1, "orders", key, key+"-T1", 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := t1.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint`).Scan(&x1); err != nil {
					t.Fatal(err)
				}
				if err := t1.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				ledger.Record(p1)
				// LockedTx's own write elsewhere does not change T2's id.
				p2, err := e2e.LockedTx(ctx, t2, "orders", key, key+"-T2", 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := t2.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				ledger.Record(p2)
				if x2 >= x1 {
					t.Fatalf("T2's transaction id %d is not below T1's %d: the case is not set up", x2, x1)
				}
			}
			run := func(extra ...string) *e2e.Proc {
				return e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t), append([]string{"--source", c.source}, extra...)...)...)
			}
			if c.source == "cdc" {
				// The WAL reader's slot must exist before the events, or
				// it reads them from the table.
				relay := run()
				e2e.WaitRole(t, relay, "leader", 30*time.Second)
				e2e.WaitReady(t, relay, true, 30*time.Second)
				relay.Signal(syscall.SIGTERM)
				relay.Wait(30 * time.Second)
			}
			for k := 0; k < 5; k++ {
				scenario(k)
			}
			relay := run()
			e2e.WaitRole(t, relay, "leader", 30*time.Second)
			for k := 5; k < 10; k++ {
				scenario(k)
			}
			e2e.WaitDrained(t, url, "outbox", time.Minute)
			relay.Stop(30 * time.Second)
			records := e2e.ReadLog(t, dataDir, "orders")
			e2e.Check(t, records, ledger)
			if len(records) != 20 {
				t.Fatalf("%d records, want 20", len(records))
			}
		})
	}
}

// TestHotKeysCommitOrder: 8 writers on 50 hot keys; each transaction writes
// elsewhere first (taking its transaction id), then locks the key's
// business row with SELECT ... FOR UPDATE, bumps its version and writes an
// event carrying the version; one in 20 rolls back. The relay is SIGKILLed
// at random moments meanwhile (a third of the time with acknowledgements
// held back). Each key's events in the log must have strictly increasing
// versions, every committed event exactly once, nothing rolled back. Run
// with track_commit_timestamp off and on, and, with it on, also with each
// event written before the lock (its row id then follows the INSERTs, not
// the commits: only commit timestamps order it; the version, known only
// after the lock, is recorded beside the event, as outbox rows are
// immutable).
func TestHotKeysCommitOrder(t *testing.T) {
	cases := []struct {
		orderCase
		eventFirst bool
	}{{orderCases[0], false}, {orderCases[1], false}, {orderCase{"poll-commit-timestamps-event-before-lock", "poll", true}, true}}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			url, bin := c.database(t)
			dataDir := e2e.DataDir(t)
			addr := e2e.FreeAddr(t)
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			ledger := e2e.NewLedger()
			start := func() *e2e.Proc { return e2e.Start(t, bin, nil, runArgs(url, dataDir, addr)...) }
			relay := start()
			writeDone := make(chan error, 1)
			go func() {
				writeDone <- e2e.WriteLocked(ctx, e2e.LockedConfig{URL: url, Topic: "orders", Writers: 8, Events: 20_000,
					Keys: 50, RollbackEvery: 20, Seed: uint64(i + 1), EventFirst: c.eventFirst}, ledger)
			}()
			relay, kills, held := e2e.KillLoop{
				Locker: pgtest.Connect(t, url), Rand: rand.New(rand.NewPCG(7, uint64(i))), MinKills: 8,
				Every:   [2]time.Duration{50 * time.Millisecond, 600 * time.Millisecond},
				Hold:    [2]time.Duration{50 * time.Millisecond, 300 * time.Millisecond},
				Restart: start,
			}.Run(t, ctx, relay, writeDone)
			e2e.WaitDrained(t, url, "outbox", 3*time.Minute)
			relay.Stop(time.Minute)
			records := e2e.ReadLog(t, dataDir, "orders")
			if c.eventFirst {
				versions, err := e2e.LockedVersions(ctx, url)
				if err != nil {
					t.Fatal(err)
				}
				records = e2e.WithVersions(records, versions)
			}
			n := e2e.Check(t, records, ledger)
			if n != len(ledger.Committed) {
				t.Fatalf("the log has %d records for %d committed events", n, len(ledger.Committed))
			}
			t.Logf("%d events on 50 hot keys in version order, exactly once, through %d SIGKILLs (%d with acknowledgements held); %d rolled back absent",
				n, kills, held, len(ledger.RolledBack))
		})
	}
}
