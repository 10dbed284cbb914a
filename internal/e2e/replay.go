package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay"
)

// CheckReplay splits records into live and replayed ones (by the
// relay-replay header, which must name request), checks the live ones with
// Check against ledger, and checks that the replayed ones are exactly the
// events of window, once each, in each partition's original order. It
// returns how many live and replayed records it checked.
func CheckReplay(t testing.TB, records []Record, ledger *Ledger, request int64, window []string) (live, replayed int) {
	t.Helper()
	var liveRecs, replayRecs []Record
	marker := fmt.Sprint(request)
	for _, r := range records {
		if v, ok := r.Headers[relay.HeaderReplay]; ok {
			if v != marker {
				t.Fatalf("replayed record with marker %q, want %q", v, marker)
			}
			replayRecs = append(replayRecs, r)
		} else {
			liveRecs = append(liveRecs, r)
		}
	}
	n := Check(t, liveRecs, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("%d live records for %d committed events", n, len(ledger.Committed))
	}
	inWindow := map[string]bool{}
	for _, id := range window {
		inWindow[id] = true
	}
	copies := map[string]int{}
	replayOrder := map[int32][]string{}
	for _, r := range replayRecs {
		id := r.Headers[relay.HeaderEventID]
		if copies[id]++; !inWindow[id] || copies[id] > 1 {
			t.Fatalf("replayed event %s: in the window %v, copy %d", id, inWindow[id], copies[id])
		}
		replayOrder[r.Partition] = append(replayOrder[r.Partition], id)
	}
	if len(copies) != len(window) {
		t.Fatalf("%d events replayed, want the %d of the window", len(copies), len(window))
	}
	originalOrder := map[int32][]string{}
	for _, r := range liveRecs {
		if id := r.Headers[relay.HeaderEventID]; inWindow[id] {
			originalOrder[r.Partition] = append(originalOrder[r.Partition], id)
		}
	}
	for p, ids := range originalOrder {
		if strings.Join(ids, ",") != strings.Join(replayOrder[p], ",") {
			t.Fatalf("partition %d: replayed order differs from the original order", p)
		}
	}
	return n, len(replayRecs)
}

// DBNow is the server's clock_timestamp(): a time to bound a replay window
// by that the server's own created_at values compare with.
func DBNow(t testing.TB, conn *pgx.Conn) time.Time {
	t.Helper()
	var now time.Time
	if err := conn.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// ArchivedWindow returns the event ids in outbox.events_archive created in
// [since, until), in publication order, and fails unless there are want.
func ArchivedWindow(t testing.TB, conn *pgx.Conn, since, until time.Time, want int) []string {
	t.Helper()
	var window []string
	rows, err := conn.Query(context.Background(), `SELECT event_id::text FROM outbox.events_archive WHERE created_at >= $1 AND created_at < $2 ORDER BY seq`, since, until)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		window = append(window, id)
	}
	if rows.Err() != nil || len(window) != want {
		t.Fatalf("the archive holds %d events of the window, want %d (%v)", len(window), want, rows.Err())
	}
	return window
}
