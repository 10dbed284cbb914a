package relay_test

import (
	"os"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestRebuildLogAfterDataDirLost is the disaster-recovery procedure of
// docs/operating.md ("Backups and disaster recovery"): a relay with
// --retain publishes 1,000 events and stops; its data directory is lost.
// A relay started on an empty data directory, and `relay replay --since`
// over the archive, rebuild the log: every committed event is in it once,
// in per-key order, with its original relay-event-id and the replay's
// relay-replay header.
func TestRebuildLogAfterDataDirLost(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	conn := pgtest.Connect(t, url)
	ledger := e2e.NewLedger()
	env := []string{"RELAY_RETAIN=1h"}
	proc := e2e.Start(t, bin, env, runArgs(url, dataDir, addr)...)
	write(t, url, ledger, 1000)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	proc.Stop(30 * time.Second)
	archived := map[string]bool{}
	rows, err := conn.Query(t.Context(), "SELECT event_id::text FROM outbox.events_archive")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		archived[id] = true
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(archived) != 1000 {
		t.Fatalf("%d events archived, want 1000", len(archived))
	}

	if err := os.RemoveAll(dataDir); err != nil {
		t.Fatal(err)
	}
	proc = e2e.Start(t, bin, env, runArgs(url, dataDir, addr)...)
	e2e.WaitReady(t, proc, true, time.Minute)
	if out, code := runCLI(t, bin, "replay", "--database-url", url, "--since", "1h"); code != 0 {
		t.Fatalf("relay replay exited %d: %s", code, out)
	}
	proc.Stop(30 * time.Second)

	records := e2e.ReadLog(t, dataDir, "orders")
	if n := e2e.Check(t, records, ledger); n != 1000 {
		t.Fatalf("%d records in the rebuilt log, want 1000", n)
	}
	for _, r := range records {
		if !archived[r.Headers["relay-event-id"]] {
			t.Fatalf("record %d@%d has relay-event-id %q, not an archived event's", r.Partition, r.Offset, r.Headers["relay-event-id"])
		}
		if r.Headers["relay-replay"] == "" {
			t.Fatalf("record %d@%d lacks the relay-replay header", r.Partition, r.Offset)
		}
	}
}
