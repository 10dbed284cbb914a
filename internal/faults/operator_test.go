package faults_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestRowsDeletedBeforeAck: while the relay's acknowledgements are held
// back (it keeps publishing into the log, with --ack-interval 1s), an
// operator deletes outbox rows (past the immutability trigger, with
// relay.allow_outbox_changes set as docs/writing-events.md says) (the oldest 300, which the relay has
// published, and every fifth row besides), and the relay is SIGKILLed
// before its acknowledgement commits; three rounds, writers running
// throughout. The deleted events may or may not be in the log (at most
// once each); every other committed event is there exactly once, in
// per-key order.
func TestRowsDeletedBeforeAck(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	r := e.newNode("relay", "--ack-interval", "1s").start()
	stopWriters := e.steady(1000, 50*time.Millisecond, ledger)
	locker := pgtest.Connect(t, e.url)
	deleter := pgtest.Connect(t, e.url)
	// The operator's way past the outbox's immutability trigger.
	if _, err := deleter.Exec(ctx, "SET relay.allow_outbox_changes = on"); err != nil {
		t.Fatal(err)
	}
	deleted := map[string]bool{}
	skips := 0
	for round := 0; round < 3; round++ {
		e2e.WaitPublished(t, e.url, int64(2000*(round+1)), time.Minute)
		done := make(chan []string, 1)
		e2e.HoldAcks(t, ctx, locker, 1500*time.Millisecond, func() {
			go func() {
				// Blocks on rows the relay's pending acknowledgement locked
				// until the kill ends it.
				rows, err := deleter.Query(ctx, `DELETE FROM outbox.events
WHERE id IN (SELECT id FROM outbox.events ORDER BY id LIMIT 300) OR id % 5 = 0 RETURNING payload`)
				var ids []string
				if err == nil {
					for rows.Next() {
						var body []byte
						var p e2e.Payload
						if err := rows.Scan(&body); err == nil && json.Unmarshal(body, &p) == nil {
							ids = append(ids, p.ID)
						}
					}
					err = rows.Err()
				}
				if err != nil {
					t.Errorf("deleting outbox rows: %v", err)
				}
				done <- ids
			}()
			time.Sleep(200 * time.Millisecond) // deliberate pause: the operator's DELETE meets the locked rows before the kill
			r.proc.Kill()
		})
		ids := <-done
		for _, id := range ids {
			deleted[id] = true
		}
		skips += outputCount(r.proc, "skipped re-delivered events")
		t.Logf("round %d: deleted %d rows, then SIGKILL", round+1, len(ids))
		r.start()
	}
	stopWriters()
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	r.stop()
	skips += outputCount(r.proc, "skipped re-delivered events")

	records := e2e.ReadLog(t, e.dataDir, "orders")
	var kept []e2e.Record
	copies := map[string]int{}
	for _, rec := range records {
		var p e2e.Payload
		if json.Unmarshal(rec.Value, &p) == nil && deleted[p.ID] {
			if copies[p.ID]++; copies[p.ID] > 1 {
				t.Errorf("deleted event %s is in the log twice", p.ID)
			}
			continue
		}
		kept = append(kept, rec)
	}
	for id := range deleted {
		if _, ok := ledger.Committed[id]; !ok {
			t.Fatalf("deleted event %s is not one the writers committed", id)
		}
		delete(ledger.Committed, id)
	}
	n := e2e.Check(t, kept, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("the log has %d records for the %d committed events not deleted", n, len(ledger.Committed))
	}
	if len(copies) == 0 {
		t.Errorf("none of the %d deleted events was in the log: the deletes never hit published rows", len(deleted))
	}
	t.Logf("%d events exactly once in per-key order; %d deleted by the operator, %d of them published before (once each); restarted relays skipped re-delivered events %d times",
		n, len(deleted), len(copies), skips)
}
