package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

func TestReplayRequests(t *testing.T) {
	f := setup(t)
	if _, found, err := f.s.GetReplay(f.ctx, f.conn, 1); found || err != nil {
		t.Fatalf("a request in an empty table: %v %v", found, err)
	}
	var reqs []int64
	for _, filter := range []string{`{"topic": "a"}`, `{"since": "2026-01-01T00:00:00Z"}`, `{}`} {
		id, err := f.s.RequestReplay(f.ctx, f.conn, filter)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, id)
	}
	if _, err := f.s.RequestReplay(f.ctx, f.conn, `not json`); err == nil {
		t.Fatal("a request with a filter that is not JSON was recorded")
	}
	q, found, err := f.s.GetReplay(f.ctx, f.conn, reqs[0])
	if err != nil || !found || q.ID != reqs[0] || q.Filter != `{"topic": "a"}` || q.Status != "pending" || q.Total != nil ||
		q.Done != 0 || q.Error != "" || q.StartedAt != nil || q.FinishedAt != nil || time.Since(q.CreatedAt) > time.Hour {
		t.Fatalf("recorded request %+v %v %v", q, found, err)
	}
	list, err := f.s.ListReplays(f.ctx, f.conn, 2)
	if err != nil || len(list) != 2 || list[0].ID != reqs[2] || list[1].ID != reqs[1] {
		t.Fatalf("listed %+v, %v; want the two newest, newest first", list, err)
	}
	f.exec(`UPDATE `+schema+`.replay_requests SET status = 'running' WHERE id = $1`, reqs[1])
	f.exec(`UPDATE `+schema+`.replay_requests SET status = 'done' WHERE id = $1`, reqs[2])
	for _, c := range []struct {
		id     int64
		want   bool
		status string
	}{{reqs[0], true, "cancelled"}, {reqs[1], true, "cancelled"}, {reqs[2], false, "done"}, {reqs[0], false, "cancelled"}, {999, false, ""}} {
		ok, err := f.s.CancelReplay(f.ctx, f.conn, c.id)
		if err != nil || ok != c.want {
			t.Fatalf("cancel %d: %v %v; want %v", c.id, ok, err, c.want)
		}
		if q, found, _ := f.s.GetReplay(f.ctx, f.conn, c.id); found && (q.Status != c.status || (q.Status == "cancelled" && q.FinishedAt == nil)) {
			t.Fatalf("request %d after cancel: %+v", c.id, q)
		}
	}
}

func TestDeadLetterCommands(t *testing.T) {
	f := setup(t)
	old := f.deadLetter(1, "t", ptr("a"), false, 0, "")
	f.exec(`UPDATE `+schema+`.dead_letters SET failed_at = $2, reason = 'schema_invalid' WHERE id = $1`, old, epoch)
	other := f.deadLetter(2, "u", ptr("b"), false, 0, "")
	keyless := f.deadLetter(3, "t", nil, false, 0, "")
	holder := f.deadLetter(4, "t", ptr("c"), true, 0, "")
	held := f.deadLetter(5, "t", ptr("c"), false, 4, "")
	resolved := f.deadLetter(6, "t", ptr("a"), false, 0, "discarded")
	all := []int64{old, other, keyless, holder, held}

	t.Run("List", func(t *testing.T) {
		for _, c := range []struct {
			name   string
			filter store.DeadLetterFilter
			limit  int
			want   []int64
		}{
			{"unresolved", store.DeadLetterFilter{}, 100, all},
			{"with resolved", store.DeadLetterFilter{Resolved: true}, 100, append(append([]int64{}, all...), resolved)},
			{"limit", store.DeadLetterFilter{}, 2, all[:2]},
			{"ids", store.DeadLetterFilter{IDs: []int64{other, holder, resolved}}, 100, []int64{other, holder}},
			{"topic", store.DeadLetterFilter{Topic: "u"}, 100, []int64{other}},
			{"key", store.DeadLetterFilter{Key: ptr("a"), Resolved: true}, 100, []int64{old, resolved}},
			{"reason", store.DeadLetterFilter{Reason: "schema_invalid"}, 100, []int64{old}},
			{"until", store.DeadLetterFilter{Until: ptr(epoch.Add(time.Hour))}, 100, []int64{old}},
			{"since", store.DeadLetterFilter{Since: ptr(epoch.Add(time.Hour))}, 100, all[1:]},
		} {
			ds, err := f.s.ListDeadLetters(f.ctx, f.conn, c.filter, c.limit)
			var got []int64
			for _, d := range ds {
				got = append(got, d.ID)
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("%s: listed %v, %v; want %v", c.name, got, err, c.want)
			}
		}
		ds, _ := f.s.ListDeadLetters(f.ctx, f.conn, store.DeadLetterFilter{IDs: []int64{held}}, 1)
		if d := ds[0]; d.EventRowID != 5 || d.Topic != "t" || *d.Key != "c" || string(d.Payload) != "d5" || *d.Headers != `{"x": "y"}` ||
			d.Reason != "held" || d.Holds || d.HeldBy == nil || *d.HeldBy != 4 || d.Resolution != "" || d.ResolvedAt != nil {
			t.Fatalf("listed dead letter %+v", d)
		}
	})
	t.Run("Retry", func(t *testing.T) {
		var n int64
		err := pgx.BeginFunc(f.ctx, f.conn, func(tx pgx.Tx) error {
			var err error
			n, err = f.s.RetryDeadLetters(f.ctx, tx, store.DeadLetterFilter{Topic: "t"})
			return err
		})
		// old, keyless and holder are marked; held (behind holder) and
		// resolved are not; only those not holding their key go back.
		if err != nil || n != 3 {
			t.Fatalf("retried %d, %v; want 3", n, err)
		}
		var rows []int64
		rs, _ := f.conn.Query(f.ctx, `SELECT e.event_id = d.event_id AND e.topic = d.topic AND e.key IS NOT DISTINCT FROM d.key
    AND e.payload = d.payload AND e.created_at = d.created_at, d.event_row_id
FROM `+schema+`.events e JOIN `+schema+`.dead_letters d ON d.event_id = e.event_id ORDER BY e.id`)
		for rs.Next() {
			var same bool
			var row int64
			rs.Scan(&same, &row)
			if !same {
				t.Fatalf("event of dead letter row %d went back changed", row)
			}
			rows = append(rows, row)
		}
		if rs.Err() != nil || !slices.Equal(rows, []int64{1, 3}) {
			t.Fatalf("events back in the outbox are of rows %v (%v); want [1 3] in that order", rows, rs.Err())
		}
		ds, _ := f.s.ListDeadLetters(f.ctx, f.conn, store.DeadLetterFilter{IDs: []int64{old, holder, held}, Resolved: true}, 10)
		if ds[0].Resolution != "retried" || ds[1].Resolution != "retried" || !ds[1].Holds || ds[2].Resolution != "" {
			t.Fatalf("after retry %+v", ds)
		}
	})
	t.Run("Discard", func(t *testing.T) {
		n, err := f.s.DiscardDeadLetters(f.ctx, f.conn, store.DeadLetterFilter{}, "gone")
		if err != nil || n != 1 {
			t.Fatalf("discarded %d, %v; want 1 (other; held events are not selected)", n, err)
		}
		ds, _ := f.s.ListDeadLetters(f.ctx, f.conn, store.DeadLetterFilter{IDs: []int64{other, held}, Resolved: true}, 10)
		if ds[0].Resolution != "discarded" || ds[0].Note != "gone" || ds[0].ResolvedAt == nil || ds[1].Resolution != "" {
			t.Fatalf("after discard %+v", ds)
		}
	})
}
