package store_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
)

// deadLetter inserts a dead letter of outbox row row and returns its id.
// heldBy 0 is NULL; resolution "" is NULL.
func (f *fixture) deadLetter(row int64, topic string, key *string, holds bool, heldBy int64, resolution string) int64 {
	f.t.Helper()
	var held *int64
	if heldBy != 0 {
		held = &heldBy
	}
	var res *string
	if resolution != "" {
		res = &resolution
	}
	return f.one(`INSERT INTO `+schema+`.dead_letters (event_row_id, event_id, topic, key, payload, headers, created_at, error, reason, holds, held_by, resolution)
VALUES ($1, gen_random_uuid(), $2, $3, convert_to('d' || $1::bigint, 'UTF8'), '{"x": "y"}', now(), 'e', CASE WHEN $5::bigint IS NULL THEN 'invalid_topic' ELSE 'held' END, $4, $5, $6)
RETURNING id`, row, topic, key, holds, held, res)
}

func TestHolds(t *testing.T) {
	f := setup(t)
	// Key a: held by row 10, then by row 20 (the newest decides); key b
	// held by row 30 whose dead letter was discarded; a keyless dead
	// letter and a non-holding one hold nothing.
	a10 := f.deadLetter(10, "t", ptr("a"), true, 0, "")
	h11 := f.deadLetter(11, "t", ptr("a"), false, 10, "")
	h12 := f.deadLetter(12, "t", ptr("a"), false, 10, "")
	f.deadLetter(13, "t", ptr("a"), false, 10, "released")
	f.deadLetter(20, "t", ptr("a"), true, 0, "")
	b30 := f.deadLetter(30, "t", ptr("b"), true, 0, "discarded")
	f.deadLetter(31, "t", ptr("b"), false, 30, "")
	f.deadLetter(40, "t", nil, true, 0, "")
	f.deadLetter(50, "u", ptr("c"), false, 0, "")

	t.Run("LoadHolds", func(t *testing.T) {
		hs, err := f.s.LoadHolds(f.ctx, f.conn)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, h := range hs {
			got[h.Topic+"/"+h.Key] = h.Row
		}
		if len(got) != 2 || got["t/a"] != 20 || got["t/b"] != 30 {
			t.Fatalf("held keys %v, want t/a by 20 and t/b by 30", got)
		}
	})
	t.Run("CountHolds", func(t *testing.T) {
		keys, events, err := f.s.CountHolds(f.ctx, f.conn)
		// Keys: (t,a), (t,b), (t,NULL); events: 11, 12, 31 (13 released).
		if err != nil || keys != 3 || events != 3 {
			t.Fatalf("counted %d keys, %d events, %v; want 3 and 3", keys, events, err)
		}
	})
	t.Run("PickRelease", func(t *testing.T) {
		id, ok, err := f.s.PickRelease(f.ctx, f.conn)
		if err != nil || !ok || id != b30 {
			t.Fatalf("picked %d %v %v, want the discarded holder %d", id, ok, err, b30)
		}
	})
	t.Run("ReadHolder", func(t *testing.T) {
		h, err := f.s.ReadHolder(f.ctx, f.conn, a10)
		if err != nil {
			t.Fatal(err)
		}
		e := h.Event
		if e.ID != a10 || e.Row != 10 || e.Topic != "t" || string(e.Key) != "a" || string(e.Payload) != "d10" ||
			string(e.Headers) != `{"x": "y"}` || !h.Holds || h.Resolution != "" || !h.Fresh {
			t.Fatalf("holder %+v", h)
		}
		f.exec(`UPDATE `+schema+`.dead_letters SET resolution = 'retried', republished_at = now() WHERE id = $1`, a10)
		if h, _ = f.s.ReadHolder(f.ctx, f.conn, a10); h.Resolution != "retried" || h.Fresh {
			t.Fatalf("republished holder %+v", h)
		}
		f.exec(`UPDATE `+schema+`.dead_letters SET resolution = NULL, republished_at = NULL WHERE id = $1`, a10)
		if _, err := f.s.ReadHolder(f.ctx, f.conn, 99999); !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("missing holder: %v", err)
		}
	})
	t.Run("KeyHolder", func(t *testing.T) {
		for _, c := range []struct {
			topic, key string
			want       int64
		}{{"t", "a", 20}, {"t", "b", 30}, {"u", "c", 0}, {"t", "none", 0}} {
			row, err := f.s.KeyHolder(f.ctx, f.conn, c.topic, c.key)
			if err != nil || row != c.want {
				t.Fatalf("holder of %s/%s: %d, %v; want %d", c.topic, c.key, row, err, c.want)
			}
		}
	})
	t.Run("HeldEvents", func(t *testing.T) {
		for _, c := range []struct {
			row   int64
			limit int
			want  []int64
		}{{10, 10, []int64{h11, h12}}, {10, 1, []int64{h11}}, {20, 10, []int64{}}} {
			es, err := f.s.HeldEvents(f.ctx, f.conn, c.row, c.limit)
			if err != nil || !slices.Equal(ids(es), c.want) {
				t.Fatalf("held behind %d (limit %d): %v, %v; want %v", c.row, c.limit, ids(es), err, c.want)
			}
		}
		es, _ := f.s.HeldEvents(f.ctx, f.conn, 10, 1)
		if es[0].Row != 11 || string(es[0].Key) != "a" || string(es[0].Payload) != "d11" {
			t.Fatalf("held event %+v", es[0])
		}
	})
}

// TestReleaseStatements runs the acknowledgement of a release chunk's
// statements as relay/release.go queues them.
func TestReleaseStatements(t *testing.T) {
	type state struct {
		resolution  string
		holds       bool
		heldBy      int64
		reason      string
		republished bool
	}
	read := func(f *fixture, id int64) state {
		var s state
		var res *string
		var held *int64
		if err := f.conn.QueryRow(f.ctx, `SELECT resolution, holds, held_by, reason, republished_at IS NOT NULL FROM `+schema+`.dead_letters WHERE id = $1`, id).
			Scan(&res, &s.holds, &held, &s.reason, &s.republished); err != nil {
			f.t.Fatal(err)
		}
		if res != nil {
			s.resolution = *res
		}
		if held != nil {
			s.heldBy = *held
		}
		return s
	}
	ack := func(f *fixture, queue func(b *pgx.Batch)) {
		if err := f.fenced(func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			queue(b)
			return send(f.ctx, tx, b)
		}); err != nil {
			f.t.Fatal(err)
		}
	}
	t.Run("RetriedHolderAndAllHeldReleased", func(t *testing.T) {
		f := setup(t)
		holder := f.deadLetter(10, "t", ptr("a"), true, 0, "retried")
		h1 := f.deadLetter(11, "t", ptr("a"), false, 10, "")
		h2 := f.deadLetter(12, "t", ptr("a"), false, 10, "")
		ack(f, func(b *pgx.Batch) {
			f.s.QueueRepublished(b, holder)
			f.s.QueueReleased(b, []int64{h1})
			f.s.QueueReleaseDone(b, holder, 10)
		})
		if s := read(f, holder); !s.republished || !s.holds {
			t.Fatalf("holder after a partial release %+v: want republished and still holding", s)
		}
		if s := read(f, h1); s.resolution != "released" {
			t.Fatalf("released held event %+v", s)
		}
		ack(f, func(b *pgx.Batch) {
			f.s.QueueReleased(b, []int64{h1, h2}) // h1 again: already resolved, untouched
			f.s.QueueReleaseDone(b, holder, 10)
		})
		if s := read(f, holder); s.holds {
			t.Fatalf("holder after the last release %+v: still holds", s)
		}
		if s := read(f, h2); s.resolution != "released" {
			t.Fatalf("last held event %+v", s)
		}
	})
	t.Run("RetryFailsAgain", func(t *testing.T) {
		f := setup(t)
		holder := f.deadLetter(10, "t", ptr("a"), true, 0, "retried")
		h1 := f.deadLetter(11, "t", ptr("a"), false, 10, "")
		ack(f, func(b *pgx.Batch) {
			f.s.QueueRetryFailed(b, holder, "schema_invalid", "still bad")
			f.s.QueueReleaseDone(b, holder, 10)
		})
		if s := read(f, holder); s.resolution != "" || !s.holds || s.reason != "schema_invalid" {
			t.Fatalf("holder whose retry failed %+v: want unresolved, holding, with the new reason", s)
		}
		if s := read(f, h1); s.resolution != "" || s.heldBy != 10 {
			t.Fatalf("held event after a failed retry %+v", s)
		}
	})
	t.Run("HeldEventBecomesTheHolder", func(t *testing.T) {
		f := setup(t)
		holder := f.deadLetter(10, "t", ptr("a"), true, 0, "discarded")
		h1 := f.deadLetter(11, "t", ptr("a"), false, 10, "")
		h2 := f.deadLetter(12, "t", ptr("a"), false, 10, "")
		h3 := f.deadLetter(13, "t", ptr("a"), false, 10, "")
		ack(f, func(b *pgx.Batch) {
			f.s.QueueReleased(b, []int64{h1})
			f.s.QueueNewHolder(b, h2, "sink_rejected", "refused")
			f.s.QueueMoveHeld(b, 10, 12, h2)
			f.s.QueueReleaseDone(b, holder, 10)
		})
		if s := read(f, holder); s.holds {
			t.Fatalf("old holder %+v: still holds after its held events moved", s)
		}
		if s := read(f, h2); !s.holds || s.heldBy != 0 || s.reason != "sink_rejected" || s.resolution != "" {
			t.Fatalf("new holder %+v", s)
		}
		if s := read(f, h3); s.heldBy != 12 || s.resolution != "" {
			t.Fatalf("event behind the new holder %+v", s)
		}
		if s := read(f, h1); s.resolution != "released" || s.heldBy != 10 {
			t.Fatalf("released event %+v", s)
		}
	})
}
