package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

// archive fills the archive with events of the given topics and keys,
// created a minute apart from epoch, and returns their seqs and event ids.
func (f *fixture) archive(topics []string, keys []*string) ([]int64, []string) {
	f.t.Helper()
	var seqs []int64
	var eventIDs []string
	for i := range topics {
		var seq int64
		var id string
		if err := f.conn.QueryRow(f.ctx, `INSERT INTO `+schema+`.events_archive (id, txid, event_id, topic, key, payload, headers, created_at)
VALUES ($1::bigint, pg_current_xact_id(), gen_random_uuid(), $2, $3, convert_to('a' || $1::bigint, 'UTF8'), NULL, $4) RETURNING seq, event_id::text`,
			100+i, topics[i], keys[i], epoch.Add(time.Duration(i)*time.Minute)).Scan(&seq, &id); err != nil {
			f.t.Fatal(err)
		}
		seqs = append(seqs, seq)
		eventIDs = append(eventIDs, id)
	}
	return seqs, eventIDs
}

func TestArchiveReads(t *testing.T) {
	f := setup(t)
	if top, err := f.s.ArchiveTop(f.ctx, f.conn); err != nil || top != 0 {
		t.Fatalf("top of an empty archive: %d, %v", top, err)
	}
	seqs, eventIDs := f.archive([]string{"a", "b", "a", "a", "b", "a"}, []*string{ptr("x"), ptr("x"), ptr("y"), nil, ptr("x"), ptr("x")})
	t.Run("Top", func(t *testing.T) {
		if top, err := f.s.ArchiveTop(f.ctx, f.conn); err != nil || top != seqs[5] {
			t.Fatalf("top %d, %v; want %d", top, err, seqs[5])
		}
	})
	t.Run("StartAtEvent", func(t *testing.T) {
		start, err := f.s.ArchiveStartAtEvent(f.ctx, f.conn, eventIDs[2])
		if err != nil || start == nil || *start != seqs[2]-1 {
			t.Fatalf("start at event 2: %v, %v; want %d", start, err, seqs[2]-1)
		}
		if start, err := f.s.ArchiveStartAtEvent(f.ctx, f.conn, "00000000-0000-0000-0000-000000000000"); err != nil || start != nil {
			t.Fatalf("start at an event not archived: %v, %v; want nil", start, err)
		}
	})
	t.Run("StartSince", func(t *testing.T) {
		for _, c := range []struct {
			since time.Time
			want  *int64
		}{
			{epoch.Add(-time.Hour), ptr(seqs[0] - 1)},
			{epoch.Add(90 * time.Second), ptr(seqs[2] - 1)},
			{epoch.Add(time.Hour), nil},
		} {
			start, err := f.s.ArchiveStartSince(f.ctx, f.conn, c.since)
			if err != nil || (start == nil) != (c.want == nil) || (start != nil && *start != *c.want) {
				t.Fatalf("start since %v: %v, %v; want %v", c.since, start, err, c.want)
			}
		}
	})
	cases := []struct {
		name           string
		after, through int64
		filter         store.ArchiveFilter
		limit          int
		want           []int64
	}{
		{"everything", seqs[0] - 1, seqs[5], store.ArchiveFilter{}, 100, seqs},
		{"bounds are (after, through]", seqs[1], seqs[4], store.ArchiveFilter{}, 100, seqs[2:5]},
		{"limit", seqs[0] - 1, seqs[5], store.ArchiveFilter{}, 2, seqs[:2]},
		{"topic", seqs[0] - 1, seqs[5], store.ArchiveFilter{Topic: "b"}, 100, []int64{seqs[1], seqs[4]}},
		{"topic and key", seqs[0] - 1, seqs[5], store.ArchiveFilter{Topic: "a", Key: ptr("x")}, 100, []int64{seqs[0], seqs[5]}},
		{"since and until", seqs[0] - 1, seqs[5], store.ArchiveFilter{Since: ptr(epoch.Add(time.Minute)), Until: ptr(epoch.Add(3 * time.Minute))}, 100, seqs[1:3]},
		{"nothing", seqs[5], seqs[5], store.ArchiveFilter{}, 100, []int64{}},
	}
	t.Run("ReplayChunk", func(t *testing.T) {
		for _, c := range cases {
			es, err := f.s.ReplayChunk(f.ctx, f.conn, c.after, c.through, c.filter, c.limit)
			if err != nil || !slices.Equal(ids(es), c.want) {
				t.Fatalf("%s: %v, %v; want %v", c.name, ids(es), err, c.want)
			}
		}
		es, _ := f.s.ReplayChunk(f.ctx, f.conn, seqs[2]-1, seqs[3], store.ArchiveFilter{}, 10)
		if e := es[0]; e.Row != 102 || e.Topic != "a" || string(e.Key) != "y" || string(e.Payload) != "a102" || e.Headers != nil ||
			e.EventID != eventIDs[2] || !e.CreatedAt.Equal(epoch.Add(2*time.Minute)) {
			t.Fatalf("archived event %+v", e)
		}
		if es[1].Key != nil {
			t.Fatalf("a NULL key read as %q", es[1].Key)
		}
	})
	t.Run("CountArchived", func(t *testing.T) {
		for _, c := range cases {
			if c.limit < 100 {
				continue
			}
			n, err := f.s.CountArchived(f.ctx, f.conn, c.after, c.through, c.filter)
			if err != nil || n != int64(len(c.want)) {
				t.Fatalf("%s: counted %d, %v; want %d", c.name, n, err, len(c.want))
			}
		}
	})
}

func TestReplayRequestSteps(t *testing.T) {
	f := setup(t)
	seqs, _ := f.archive([]string{"a", "a", "a", "a"}, []*string{nil, nil, nil, nil})
	if _, ok, err := f.s.PickReplay(f.ctx, f.conn); ok || err != nil {
		t.Fatalf("picked a replay in an empty table: %v %v", ok, err)
	}
	r1, _ := f.s.RequestReplay(f.ctx, f.conn, `{"since": "2026-01-01T00:00:00Z"}`)
	r2, _ := f.s.RequestReplay(f.ctx, f.conn, `{"topic": "a"}`)
	if id, ok, err := f.s.PickReplay(f.ctx, f.conn); !ok || err != nil || id != r1 {
		t.Fatalf("picked %d %v %v, want the oldest request %d", id, ok, err, r1)
	}
	if _, ok, _ := f.s.ReplayInFlight(f.ctx, f.conn); ok {
		t.Fatal("a chunk in flight before any was marked")
	}
	lockAndStart := func(id int64) store.ReplayState {
		var st store.ReplayState
		if err := f.fenced(func(tx pgx.Tx) error {
			var err error
			if st, err = f.s.LockReplay(f.ctx, tx, id); err != nil {
				return err
			}
			return f.s.StartReplay(f.ctx, tx, id, seqs[0]-1, seqs[3], 4)
		}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	st := lockAndStart(r1)
	if st.Status != "pending" || st.Cursor != 0 || st.Bound != nil || st.InflightThrough != nil || st.Filter != `{"since": "2026-01-01T00:00:00Z"}` {
		t.Fatalf("pending request %+v", st)
	}
	st, _ = f.s.LockReplay(f.ctx, f.conn, r1)
	if st.Status != "running" || st.Cursor != seqs[0]-1 || st.Bound == nil || *st.Bound != seqs[3] {
		t.Fatalf("started request %+v", st)
	}
	if total := f.one(`SELECT total FROM `+schema+`.replay_requests WHERE id = $1`, r1); total != 4 {
		t.Fatalf("total %d", total)
	}
	// A chunk through seqs[1] goes to the sink.
	if err := f.s.MarkReplayInFlight(f.ctx, f.conn, r1, seqs[1]); err != nil {
		t.Fatal(err)
	}
	fl, ok, err := f.s.ReplayInFlight(f.ctx, f.conn)
	if err != nil || !ok || fl != (store.InFlight{Request: r1, Filter: `{"since": "2026-01-01T00:00:00Z"}`, Cursor: seqs[0] - 1, Through: seqs[1]}) {
		t.Fatalf("in flight %+v %v %v", fl, ok, err)
	}
	if id, _, _ := f.s.PickReplay(f.ctx, f.conn); id != r2 {
		t.Fatalf("picked %d while %d has a chunk in flight, want %d", id, r1, r2)
	}
	// Its acknowledgement moves the cursor, clears the mark, counts.
	if err := f.fenced(func(tx pgx.Tx) error { return f.s.ReplayAck(f.ctx, tx, r1, seqs[1], 2) }); err != nil {
		t.Fatal(err)
	}
	st, _ = f.s.LockReplay(f.ctx, f.conn, r1)
	if st.Status != "running" || st.Cursor != seqs[1] || st.InflightThrough != nil {
		t.Fatalf("after the first chunk %+v", st)
	}
	// The last chunk's acknowledgement, queued, reaches the bound: done.
	if err := f.fenced(func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		f.s.QueueReplayAck(b, r1, seqs[3], 2)
		return send(f.ctx, tx, b)
	}); err != nil {
		t.Fatal(err)
	}
	q, found, err := f.s.GetReplay(f.ctx, f.conn, r1)
	if err != nil || !found || q.Status != "done" || q.Done != 4 || q.FinishedAt == nil {
		t.Fatalf("after the last chunk %+v %v %v", q, found, err)
	}
	if err := f.s.FailReplay(f.ctx, f.conn, r2, "no such event"); err != nil {
		t.Fatal(err)
	}
	q, _, _ = f.s.GetReplay(f.ctx, f.conn, r2)
	if q.Status != "failed" || q.Error != "no such event" || q.FinishedAt == nil {
		t.Fatalf("failed request %+v", q)
	}
	if _, ok, _ := f.s.PickReplay(f.ctx, f.conn); ok {
		t.Fatal("picked a finished request")
	}
}

func TestPruneArchive(t *testing.T) {
	f := setup(t)
	seqs, _ := f.archive([]string{"a", "a", "a", "a", "a", "a"}, make([]*string, 6))
	// Rows 0..3 published two hours ago, 4..5 now.
	f.exec(`UPDATE `+schema+`.events_archive SET published_at = now() - interval '2 hours' WHERE seq <= $1`, seqs[3])
	left := func() []int64 { return f.int64s(`SELECT seq FROM ` + schema + `.events_archive ORDER BY seq`) }
	// A running replay at cursor seqs[1] keeps everything above it.
	r := f.one(`INSERT INTO ` + schema + `.replay_requests (filter, status, cursor, bound) VALUES ('{}', 'running', ` +
		`(SELECT min(seq) FROM ` + schema + `.events_archive) + 1, 0) RETURNING id`)
	for _, c := range []struct {
		name  string
		older string
		limit int
		want  int64
		left  []int64
	}{
		{"newer than the retention", "3 hours", 10, 0, seqs},
		{"limited", "1 hour", 1, 1, seqs[1:]},
		{"not above a running replay's cursor", "1 hour", 10, 1, seqs[2:]},
	} {
		n, err := f.s.PruneArchive(f.ctx, f.conn, c.older, c.limit)
		if err != nil || n != c.want || !slices.Equal(left(), c.left) {
			t.Fatalf("%s: pruned %d, %v, left %v; want %d and %v", c.name, n, err, left(), c.want, c.left)
		}
	}
	f.exec(`UPDATE `+schema+`.replay_requests SET status = 'done' WHERE id = $1`, r)
	if n, err := f.s.PruneArchive(f.ctx, f.conn, "1 hour", 10); err != nil || n != 2 || !slices.Equal(left(), seqs[4:]) {
		t.Fatalf("after the replay finished: pruned %d, %v, left %v", n, err, left())
	}
	// An in-flight chunk keeps the rows above its cursor too.
	f.exec(`UPDATE ` + schema + `.events_archive SET published_at = now() - interval '2 hours'`)
	f.exec(`UPDATE `+schema+`.replay_requests SET status = 'cancelled', cursor = $2, inflight_through = $3 WHERE id = $1`, r, seqs[4], seqs[5])
	if n, err := f.s.PruneArchive(f.ctx, f.conn, "1 hour", 10); err != nil || n != 1 || !slices.Equal(left(), seqs[5:]) {
		t.Fatalf("with a chunk in flight: pruned %d, %v, left %v", n, err, left())
	}
}
