package cdc_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestE2ETwoDatabasesDefaultSlotNames: two databases of one cluster, each
// with an outbox and its own relay reading the WAL with the default slot
// and publication names, under writers at once. Database A's relay first
// ran with the slot "relay_outbox" (the default of earlier relays) and is
// SIGKILLed; restarted without --slot it keeps that slot. Database B's
// relay gets "relay_outbox_<oid>" (with the earlier default it was refused:
// the slot relay_outbox belongs to database A). Each log holds its own
// database's events exactly once, in per-key order, and nothing of the
// other's; each database has exactly its one slot.
func TestE2ETwoDatabasesDefaultSlotNames(t *testing.T) {
	a, b := newRelayEnv(t), newRelayEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := func(e *relayEnv, extra ...string) *e2e.Proc {
		args := []string{"run", "--source", "cdc", "--database-url", e.url, "--data-dir", e.dataDir, "--http-addr", e.addr,
			"--heartbeat-interval", "200ms", "--kafka-addr", "", "--leader-lease", "1s"}
		return e2e.Start(t, e.bin, nil, append(args, extra...)...)
	}
	ledgerA, ledgerB := e2e.NewLedger(), e2e.NewLedger()

	old := run(a, "--slot", "relay_outbox")
	if err := e2e.Write(ctx, e2e.CrashLoad(a.url, 2000, 100), ledgerA); err != nil {
		t.Fatal(err)
	}
	e2e.WaitPublished(t, a.url, 1000, time.Minute)
	old.Kill()

	relayA, relayB := run(a), run(b)
	doneA := e2e.WriteAsync(ctx, e2e.CrashLoad(a.url, 5000, 100), ledgerA)
	doneB := e2e.WriteAsync(ctx, e2e.CrashLoad(b.url, 5000, 100), ledgerB)
	for _, done := range []<-chan error{doneA, doneB} {
		if err := <-done; err != nil {
			t.Fatalf("writers: %v", err)
		}
	}
	e2e.WaitDrained(t, a.url, "outbox", 2*time.Minute)
	e2e.WaitDrained(t, b.url, "outbox", 2*time.Minute)
	relayA.Stop(time.Minute)
	relayB.Stop(time.Minute)

	nA := e2e.CheckLog(t, a.dataDir, ledgerA)
	nB := e2e.CheckLog(t, b.dataDir, ledgerB)
	if !strings.Contains(relayA.Output(), "using the replication slot of the name earlier relays chose") {
		t.Errorf("relay A did not say it keeps the earlier slot name")
	}
	admin := pgtest.Connect(t, a.url)
	slots := func(e *relayEnv) string {
		var names string
		if err := admin.QueryRow(ctx, `SELECT coalesce(string_agg(slot_name, ',' ORDER BY slot_name), '') FROM pg_replication_slots WHERE database = $1`,
			e.db).Scan(&names); err != nil {
			t.Fatal(err)
		}
		return names
	}
	if got := slots(a); got != "relay_outbox" {
		t.Errorf("database A has slots %q, want relay_outbox (kept)", got)
	}
	var oidB uint32
	bConn := pgtest.Connect(t, b.url)
	if err := bConn.QueryRow(ctx, "SELECT oid FROM pg_database WHERE datname = current_database()").Scan(&oidB); err != nil {
		t.Fatal(err)
	}
	if got, want := slots(b), "relay_outbox_"+strconv.FormatUint(uint64(oidB), 10); got != want {
		t.Errorf("database B has slots %q, want %q", got, want)
	}
	t.Logf("database A: %d events exactly once in per-key order on the kept slot relay_outbox (one SIGKILL); database B: %d on relay_outbox_%d",
		nA, nB, oidB)
}
