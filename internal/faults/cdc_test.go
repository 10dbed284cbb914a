package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// cdcNode is a relay node reading the WAL through a slot of its own name.
func (e *env) cdcNode(name string, extra ...string) (*node, string) {
	e.t.Helper()
	cfg, err := pgx.ParseConfig(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	slot := "slot_" + cfg.Database
	return e.newNode(name, append([]string{"--source", "cdc", "--slot", slot, "--heartbeat-interval", "200ms"}, extra...)...), slot
}

// dropSlot drops slot once no walsender holds it.
func (e *env) dropSlot(slot string) {
	e.t.Helper()
	ctx := context.Background()
	waitFor(e.t, 30*time.Second, "the slot to be dropped", func() bool {
		e.admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
		_, err := e.admin.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot)
		return err == nil
	})
}

// TestSlotDroppedWhileDown: the WAL reader is SIGKILLed while its
// acknowledgements are held back (so the log holds published but
// unacknowledged events), its slot is dropped while it is down, and it is
// restarted; three rounds, 8 writers throughout. Recovery reads the
// unpublished rows from the table, in an order other than the WAL's: the
// log holds every event exactly once, in per-key order.
func TestSlotDroppedWhileDown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	r, slot := e.cdcNode("relay")
	r.start()
	stopWriters := e.steady(1000, 50*time.Millisecond, ledger)
	locker := pgtest.Connect(t, e.url)
	unacked, missing := 0, 0
	for round := 0; round < 3; round++ {
		e2e.WaitPublished(t, e.url, int64(2000*(round+1)), time.Minute)
		e2e.HoldAcks(t, ctx, locker, 800*time.Millisecond, r.proc.Kill)
		e.dropSlot(slot)
		r.start()
		waitFor(t, time.Minute, "the restarted relay's pipeline", func() bool { return outputCount(r.proc, "pipeline started") > 0 })
		unacked += outputCount(r.proc, "the log holds unacknowledged events")
		missing += outputCount(r.proc, "REPLICATION SLOT MISSING")
		t.Logf("round %d: SIGKILL with acknowledgements held back, slot dropped, restarted", round+1)
	}
	stopWriters()
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	r.stop()
	n := e.checkAll(ledger)
	if unacked == 0 {
		t.Errorf("no restart found unacknowledged events in the log: the kills never landed between publish and acknowledgement")
	}
	if missing < 3 {
		t.Errorf("the restarted relay reported the missing slot %d times for 3 drops", missing)
	}
	t.Logf("%d events exactly once in per-key order through 3 slot drops while down (%d restarts found unacknowledged events in the log)", n, unacked)
}
