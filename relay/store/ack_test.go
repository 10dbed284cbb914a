package store_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

func TestCheckpoint(t *testing.T) {
	f := setup(t)
	if _, found, err := f.s.LoadCheckpoint(f.ctx, f.conn, "r"); err != nil || found {
		t.Fatalf("checkpoint of a fresh schema: found %v, %v", found, err)
	}
	save := func(ck store.Checkpoint, published int, fail error) error {
		return f.fenced(func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			f.s.QueueCheckpoint(b, "r", ck, published)
			if err := send(f.ctx, tx, b); err != nil {
				return err
			}
			return fail
		})
	}
	steps := []struct {
		name      string
		ck        store.Checkpoint
		published int
		rollback  bool
		want      store.Checkpoint
		total     int64
	}{
		{"first save", store.Checkpoint{Major: 3, Minor: 1, State: []byte("s1"), Source: "poll"}, 5, false,
			store.Checkpoint{Major: 3, Minor: 1, State: []byte("s1"), Source: "poll"}, 5},
		{"update adds to published", store.Checkpoint{Major: 9, Minor: 0, State: []byte("s2"), Source: "cdc"}, 2, false,
			store.Checkpoint{Major: 9, Minor: 0, State: []byte("s2"), Source: "cdc"}, 7},
		{"rolled back with its transaction", store.Checkpoint{Major: 99, Minor: 9, State: []byte("lost"), Source: "poll"}, 100, true,
			store.Checkpoint{Major: 9, Minor: 0, State: []byte("s2"), Source: "cdc"}, 7},
		{"nil state", store.Checkpoint{Major: 10, Source: "cdc"}, 0, false,
			store.Checkpoint{Major: 10, Source: "cdc"}, 7},
	}
	for _, s := range steps {
		var fail error
		if s.rollback {
			fail = errors.New("rollback")
		}
		if err := save(s.ck, s.published, fail); err != nil && !s.rollback {
			t.Fatalf("%s: %v", s.name, err)
		}
		got, found, err := f.s.LoadCheckpoint(f.ctx, f.conn, "r")
		if err != nil || !found {
			t.Fatalf("%s: load: %v %v", s.name, found, err)
		}
		if got.Major != s.want.Major || got.Minor != s.want.Minor || string(got.State) != string(s.want.State) ||
			(got.State == nil) != (s.want.State == nil) || got.Source != s.want.Source {
			t.Fatalf("%s: loaded %+v, want %+v", s.name, got, s.want)
		}
		if n := f.one(`SELECT published FROM ` + schema + `.checkpoints WHERE name = 'r'`); n != s.total {
			t.Fatalf("%s: published %d, want %d", s.name, n, s.total)
		}
	}
	if _, found, _ := f.s.LoadCheckpoint(f.ctx, f.conn, "other"); found {
		t.Fatal("another relay's name found r's checkpoint")
	}
}

func TestDelete(t *testing.T) {
	for _, c := range []struct {
		name    string
		lo, hi  []int64 // offsets into the 10 inserted rows
		singles []int64
		want    int64
	}{
		{name: "one range", lo: []int64{0}, hi: []int64{4}, want: 5},
		{name: "two ranges", lo: []int64{0, 6}, hi: []int64{2, 9}, want: 7},
		{name: "singles", singles: []int64{1, 3, 8}, want: 3},
		{name: "ranges and singles", lo: []int64{2}, hi: []int64{5}, singles: []int64{0, 9}, want: 6},
		{name: "singles not in the outbox", singles: []int64{100, 101}, want: 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := setup(t)
			rows := f.events(10, "t", nil)
			at := func(offs []int64) []int64 {
				var out []int64
				for _, o := range offs {
					out = append(out, rows[0]+o)
				}
				return out
			}
			gone := map[int64]bool{}
			for i := range c.lo {
				for id := rows[0] + c.lo[i]; id <= rows[0]+c.hi[i]; id++ {
					gone[id] = true
				}
			}
			for _, id := range at(c.singles) {
				gone[id] = true
			}
			var n int64
			err := f.fenced(func(tx pgx.Tx) error {
				if len(c.lo) > 0 {
					d, err := f.s.DeleteRanges(f.ctx, tx, at(c.lo), at(c.hi))
					if err != nil {
						return err
					}
					n += d
				}
				if len(c.singles) > 0 {
					d, err := f.s.DeleteIDs(f.ctx, tx, at(c.singles))
					if err != nil {
						return err
					}
					n += d
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if n != c.want {
				t.Fatalf("deleted %d rows, want %d", n, c.want)
			}
			var want []int64
			for _, id := range rows {
				if !gone[id] {
					want = append(want, id)
				}
			}
			if left := f.outboxIDs(); !slices.Equal(left, want) {
				t.Fatalf("outbox keeps %v, want %v", left, want)
			}
		})
	}
}

func TestArchiveRows(t *testing.T) {
	f := setup(t)
	rows := f.events(6, "t", ptr("k"))
	// Rows 0..4 acknowledged; 1 is a dead letter (not published); the
	// sink made the others durable in the order 3, 0, 4, 2. Row 5 stays;
	// id 999 is not in the outbox.
	acked := []int64{rows[0], rows[1], rows[2], rows[3], rows[4], 999}
	published := []int64{rows[3], rows[0], rows[4], rows[2]}
	var removed []int64
	err := f.fenced(func(tx pgx.Tx) error {
		var err error
		removed, err = f.s.ArchiveRows(f.ctx, tx, acked, published)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	gone := map[int64]bool{}
	for _, id := range removed {
		gone[id] = true
	}
	if len(removed) != 5 || gone[999] || gone[rows[5]] {
		t.Fatalf("removed %v, want rows %v", removed, acked[:5])
	}
	if left := f.outboxIDs(); !slices.Equal(left, rows[5:]) {
		t.Fatalf("outbox keeps %v, want %v", left, rows[5:])
	}
	archived := f.int64s(`SELECT id FROM ` + schema + `.events_archive ORDER BY seq`)
	if !slices.Equal(archived, published) {
		t.Fatalf("archive holds %v in seq order, want %v", archived, published)
	}
	var same bool
	if err := f.conn.QueryRow(f.ctx, `SELECT a.payload = convert_to('p4', 'UTF8') AND a.key = 'k' AND a.headers = '{"h": "v"}'
FROM `+schema+`.events_archive a WHERE a.id = $1`, rows[3]).Scan(&same); err != nil || !same {
		t.Fatalf("archived row differs from the outbox row: %v", err)
	}
}

func TestDeadLetterRecords(t *testing.T) {
	f := setup(t)
	rows := f.events(3, "t", ptr("k"))
	var eventID string
	f.conn.QueryRow(f.ctx, `SELECT event_id::text FROM `+schema+`.events WHERE id = $1`, rows[0]).Scan(&eventID)
	inserted := store.DeadLetterRow{Row: rows[0], EventID: eventID, Topic: "t", Key: ptr("k"), Payload: []byte("body"),
		Headers: ptr(`{"a": "b"}`), CreatedAt: epoch, Error: "bad topic", Reason: "invalid_topic", Holds: true}
	queued := store.DeadLetterRow{Row: -5, EventID: "00000000-0000-0000-0000-000000000001", Topic: "t2", CreatedAt: epoch,
		Error: "held", Reason: "held", HeldBy: ptr(rows[0])}
	copied := store.DeadLetterRow{Row: rows[1], EventID: "ignored", Topic: "ignored", Error: "too large", Reason: "too_large"}
	missing := store.DeadLetterRow{Row: 12345, Error: "too large", Reason: "too_large"}
	var copiedOK, missingOK bool
	err := f.fenced(func(tx pgx.Tx) error {
		if err := f.s.InsertDeadLetter(f.ctx, tx, inserted); err != nil {
			return err
		}
		var err error
		if copiedOK, err = f.s.CopyDeadLetter(f.ctx, tx, copied); err != nil {
			return err
		}
		if missingOK, err = f.s.CopyDeadLetter(f.ctx, tx, missing); err != nil {
			return err
		}
		b := &pgx.Batch{}
		f.s.QueueDeadLetter(b, queued)
		return send(f.ctx, tx, b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !copiedOK || missingOK {
		t.Fatalf("CopyDeadLetter reported %v for an outbox row and %v for a missing one", copiedOK, missingOK)
	}
	type row struct {
		row             int64
		eventID, topic  string
		key, headers    *string
		payload         []byte
		errText, reason string
		holds           bool
		heldBy          *int64
	}
	got := map[int64]row{}
	rs, err := f.conn.Query(f.ctx, `SELECT event_row_id, event_id::text, topic, key, headers::text, payload, error, reason, holds, held_by
FROM `+schema+`.dead_letters ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.row, &r.eventID, &r.topic, &r.key, &r.headers, &r.payload, &r.errText, &r.reason, &r.holds, &r.heldBy); err != nil {
			t.Fatal(err)
		}
		got[r.row] = r
	}
	if len(got) != 3 {
		t.Fatalf("%d dead letters, want 3 (none for the missing row): %+v", len(got), got)
	}
	if r := got[rows[0]]; r.eventID != eventID || r.topic != "t" || *r.key != "k" || string(r.payload) != "body" ||
		*r.headers != `{"a": "b"}` || r.errText != "bad topic" || r.reason != "invalid_topic" || !r.holds || r.heldBy != nil {
		t.Fatalf("inserted dead letter %+v", r)
	}
	if r := got[-5]; r.key != nil || r.payload != nil || r.headers != nil || r.reason != "held" || r.holds || r.heldBy == nil || *r.heldBy != rows[0] {
		t.Fatalf("queued dead letter %+v", r)
	}
	// The copy takes the event's content from the outbox row, not from
	// the arguments.
	if r := got[rows[1]]; r.topic != "t" || *r.key != "k" || string(r.payload) != "p2" || *r.headers != `{"h": "v"}` ||
		r.errText != "too large" || r.reason != "too_large" || r.eventID == "ignored" {
		t.Fatalf("copied dead letter %+v", r)
	}
}

// TestBacklogPassesDeletedRowsOnce: acknowledged rows stay in the table
// until a vacuum, and the backlog count must not read them at every sample.
// During a drain (the oldest 60,000 of 170,000 rows deleted) the count
// stops at 100,001 rows before it reaches the deleted ones; once the
// backlog is small (all but 10 deleted, and statistics that say the table
// is nearly empty) the third count reads a handful of the table's blocks
// where a scan of the table reads every one.
func TestBacklogPassesDeletedRowsOnce(t *testing.T) {
	f := setup(t)
	events := schema + `.events`
	f.exec(`ALTER TABLE ` + events + ` SET (autovacuum_enabled = false)`)
	f.exec(`INSERT INTO ` + events + ` (topic, payload) SELECT 't', convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, 170000)`)
	f.exec(`ANALYZE ` + events)
	blocks := func(where string) int64 {
		t.Helper()
		var n int64
		if err := f.conn.QueryRow(f.ctx, `SELECT count(DISTINCT (ctid::text::point)[0]) FROM `+events+where).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var firstID int64
	if err := f.conn.QueryRow(f.ctx, `SELECT min(id) FROM `+events).Scan(&firstID); err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf(` WHERE id < %d`, firstID+60000)
	prefixBlocks, tableBlocks := blocks(prefix), blocks("")
	remove := func(where string) {
		t.Helper()
		f.exec(`BEGIN`)
		f.exec(`SET LOCAL relay.allow_outbox_changes = on`)
		f.exec(`DELETE FROM ` + events + where)
		f.exec(`COMMIT`)
		f.exec(`ANALYZE ` + events)
	}
	// blocksRead is the table's blocks read or found in shared buffers so
	// far. The session's statistics reach the server at the end of the
	// statement that forces the next flush, so that comes first.
	blocksRead := func() int64 {
		t.Helper()
		f.exec(`SELECT pg_stat_force_next_flush()`)
		var n int64
		if err := f.conn.QueryRow(f.ctx, `SELECT heap_blks_read + heap_blks_hit FROM pg_statio_user_tables WHERE relid = $1::regclass`, events).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	count := func() (n, read int64) {
		t.Helper()
		before := blocksRead()
		n, err := f.s.Backlog(f.ctx, f.conn)
		if err != nil {
			t.Fatal(err)
		}
		return n, blocksRead() - before
	}

	remove(prefix)
	n, read := count()
	t.Logf("drain: %d rows counted, %d blocks read; the deleted rows fill %d of the table's %d blocks", n, read, prefixBlocks, tableBlocks)
	if n < 100001 || read > tableBlocks-prefixBlocks/2 {
		t.Fatalf("drain: counted %d reading %d blocks; want more than 100,000 without reading the %d blocks of deleted rows (table: %d)", n, read, prefixBlocks, tableBlocks)
	}

	remove(` WHERE id <= (SELECT max(id) - 10 FROM ` + events + `)`)
	var reads []int64
	for range 3 {
		n, read := count()
		if n != 10 {
			t.Fatalf("backlog %d; want 10", n)
		}
		reads = append(reads, read)
	}
	t.Logf("small backlog: table blocks read by each count: %v of %d", reads, tableBlocks)
	if reads[2] > tableBlocks/10 {
		t.Fatalf("the counts read %v of the table's %d blocks; the third should read a few", reads, tableBlocks)
	}
}

func TestHeartbeatAndBacklog(t *testing.T) {
	f := setup(t)
	for _, want := range []int64{0, 1, 2} {
		n, err := f.s.Backlog(f.ctx, f.conn)
		if err != nil || n != want {
			t.Fatalf("backlog %d, %v; want %d", n, err, want)
		}
		if err := f.s.InsertHeartbeat(f.ctx, f.conn, "relay heartbeat", []byte("nonce/1")); err != nil {
			t.Fatal(err)
		}
	}
	var topic, payload string
	var key *string
	if err := f.conn.QueryRow(f.ctx, `SELECT topic, key, convert_from(payload, 'UTF8') FROM `+schema+`.events LIMIT 1`).Scan(&topic, &key, &payload); err != nil {
		t.Fatal(err)
	}
	if topic != "relay heartbeat" || key != nil || payload != "nonce/1" {
		t.Fatalf("heartbeat row (%q, %v, %q)", topic, key, payload)
	}
	// Past 100,000 rows the count stops and the planner's estimate takes
	// over when it is larger.
	f.exec(`INSERT INTO ` + schema + `.events (topic) SELECT 't' FROM generate_series(1, 100100)`)
	f.exec(`ANALYZE ` + schema + `.events`)
	n, err := f.s.Backlog(f.ctx, f.conn)
	if err != nil || n < 100001 {
		t.Fatalf("backlog of 100,103 rows: %d, %v", n, err)
	}
}
