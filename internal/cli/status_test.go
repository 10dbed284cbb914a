package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// TestStatusCountsAreBounded: `relay status` reads the outbox and the
// archive as the daemon's backlog sample does, exactly up to 100,000 rows
// and by the planner's estimate beyond, and says which counts are
// estimates.
func TestStatusCountsAreBounded(t *testing.T) {
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	type report struct {
		Backlog struct {
			Rows      int64 `json:"rows"`
			Estimated bool  `json:"rows_estimated"`
		} `json:"backlog"`
		Archive struct {
			Rows      int64 `json:"rows"`
			Estimated bool  `json:"rows_estimated"`
		} `json:"archive"`
	}
	status := func() report {
		t.Helper()
		r := relay(t, nil, "status", "--database-url", url, "--http-addr", "", "--json")
		var rep report
		if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &rep) != nil {
			t.Fatalf("status --json: exit %d: %s%s", r.Code, r.Stdout, r.Stderr)
		}
		return rep
	}
	exec(`INSERT INTO outbox.events (topic) VALUES ('t'), ('t'), ('t')`)
	if rep := status(); rep.Backlog.Rows != 3 || rep.Backlog.Estimated || rep.Archive.Rows != 0 {
		t.Fatalf("status of 3 events: %+v", rep)
	}
	// Never analyzed (autovacuum off for it), the archive has no estimate:
	// a count that read every row would say 100,100.
	exec(`ALTER TABLE outbox.events_archive SET (autovacuum_enabled = false)`)
	exec(`INSERT INTO outbox.events_archive (id, txid, event_id, topic, created_at)
SELECT i, pg_current_xact_id(), gen_random_uuid(), 't', now() FROM generate_series(1, 100100) AS i`)
	if rep := status(); rep.Archive.Rows != 100001 || !rep.Archive.Estimated || rep.Backlog.Rows != 3 {
		t.Fatalf("status of an archive of 100,100 rows: %+v; want 100001, estimated", rep)
	}
	r := relay(t, nil, "status", "--database-url", url, "--http-addr", "")
	if r.Code != 0 || !strings.Contains(r.Stdout, "about 100001 events") || !strings.Contains(r.Stdout, "3 rows, oldest") {
		t.Fatalf("status: exit %d:\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
}
