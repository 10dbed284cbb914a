package poller_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestLongTransactionsDoNotHoldBack holds two writing transactions open for
// 30 s while writers commit events: one in another database of the cluster,
// one in the outbox's database that wrote another table and an event of its
// own. Every event committed meanwhile is published while both are still
// open (the horizon-based reader published none of them until the
// transactions ended); the held event is published after its commit;
// nothing is lost or doubled. The publish latency's p99 over the run is
// reported; its only bound is a generous sanity check, far below the hold.
func TestLongTransactionsDoNotHoldBack(t *testing.T) {
	env := newRelayEnv(t)
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	otherURL := pgtest.NewDatabase(t)
	other := pgtest.Connect(t, otherURL)
	if _, err := other.Exec(ctx, `CREATE TABLE batch_job (n bigint)`); err != nil {
		t.Fatal(err)
	}
	if err := e2e.SetupLocked(ctx, env.url, 1); err != nil {
		t.Fatal(err)
	}
	relay := env.start()
	e2e.WaitRole(t, relay, "leader", 30*time.Second)

	foreign, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Rollback(ctx)
	if _, err := foreign.Exec(ctx, `INSERT INTO batch_job (n) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	local, err := pgtest.Connect(t, env.url).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Rollback(ctx)
	if _, err := local.Exec(ctx, `INSERT INTO public.relay_test_elsewhere (n) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	held := e2e.Payload{ID: "held-tx", Key: "held-key", Seq: 0}
	body, _ := json.Marshal(held)
	if _, err := local.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', $1, $2, '{"test":"e2e"}')`, held.Key, body); err != nil {
		t.Fatal(err)
	}
	heldAt := time.Now()

	stop := e2e.WriteSteadily(ctx, e2e.WriterConfig{URL: env.url, Schema: "outbox", Topic: "orders", Writers: 2,
		Events: 100, Keys: 100, PerTx: 5, PayloadBytes: 200}, ledger, 20*time.Millisecond)
	time.Sleep(30*time.Second - time.Since(heldAt)) // deliberate pause: holds the long transaction open for 30 s under load
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	written := ledger.Len()
	// Everything but the held event is published while both transactions
	// are still open (the held row is invisible to this count).
	conn := pgtest.Connect(t, env.url)
	e2e.WaitDrained(t, env.url, "outbox", time.Minute)
	e2e.WaitPublished(t, env.url, int64(written), time.Minute)
	if n, err := e2e.Published(ctx, conn); err != nil || n != int64(written) {
		t.Fatalf("published %d (%v) with the long transactions open, want the %d written meanwhile", n, err, written)
	}
	p99, n := e2e.LatencyQuantile(t, env.addr, 0.99)
	p50, _ := e2e.LatencyQuantile(t, env.addr, 0.5)
	if err := local.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ledger.Record(held)
	if err := foreign.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e2e.WaitPublished(t, env.url, int64(written)+1, time.Minute)
	relay.Stop(time.Minute)
	records := e2e.ReadLog(t, env.dataDir, "orders")
	e2e.Check(t, records, ledger)
	t.Logf("%d events committed during a 30 s transaction in another database and one in this one: all published while they were open, publish latency p50 %v, p99 %v (over %d events); the held event published after its commit; %d records exactly once",
		written, p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), n, len(records))
	if p99 > 5*time.Second {
		t.Fatalf("publish latency p99 %v during the long transactions: they held publication back", p99)
	}
}
