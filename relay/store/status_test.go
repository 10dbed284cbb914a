package store_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/relay/relay/store"
)

func TestReadLeadership(t *testing.T) {
	f := setup(t)
	l, err := f.s.ReadLeadership(f.ctx, f.conn)
	if err != nil || l != (store.Leadership{}) {
		t.Fatalf("migrated leadership %+v, %v; want epoch 0, no holder, not running", l, err)
	}
	f.exec(`UPDATE ` + schema + `.leadership SET epoch = 3, holder = 'host-a'`)
	f.exec(`UPDATE ` + schema + `.leader_lease SET epoch = 3, released = false, lease_ms = 60000, renewed_at = now()`)
	if l, err := f.s.ReadLeadership(f.ctx, f.conn); err != nil || l != (store.Leadership{Epoch: 3, Holder: "host-a", Running: true}) {
		t.Fatalf("a renewed lease: %+v, %v", l, err)
	}
	f.exec(`UPDATE ` + schema + `.leader_lease SET renewed_at = now() - interval '2 minutes'`)
	if l, err := f.s.ReadLeadership(f.ctx, f.conn); err != nil || l.Running {
		t.Fatalf("an expired lease: %+v, %v; want not running", l, err)
	}
	f.exec(`UPDATE ` + schema + `.leader_lease SET renewed_at = now(), released = true`)
	if l, err := f.s.ReadLeadership(f.ctx, f.conn); err != nil || l.Running {
		t.Fatalf("a released lease: %+v, %v; want not running", l, err)
	}
}

func TestListCheckpoints(t *testing.T) {
	f := setup(t)
	if cs, err := f.s.ListCheckpoints(f.ctx, f.conn); err != nil || len(cs) != 0 {
		t.Fatalf("no checkpoint: %+v, %v", cs, err)
	}
	f.exec(`INSERT INTO `+schema+`.checkpoints (name, position_major, position_minor, sink_state, published, source, updated_at)
VALUES ('b', 7, 2, NULL, 40, 'cdc', now()), ('a', 5, 0, NULL, 12, 'poll', $1)`, epoch)
	cs, err := f.s.ListCheckpoints(f.ctx, f.conn)
	if err != nil || len(cs) != 2 {
		t.Fatalf("checkpoints %+v, %v", cs, err)
	}
	a := cs[0]
	if a.Name != "a" || a.Source != "poll" || a.Major != 5 || a.Minor != 0 || a.Published != 12 || !a.UpdatedAt.Equal(epoch) {
		t.Fatalf("checkpoint a: %+v", a)
	}
	if b := cs[1]; b.Name != "b" || b.Source != "cdc" || b.Major != 7 || b.Minor != 2 || b.Published != 40 {
		t.Fatalf("checkpoint b: %+v", b)
	}
}

func TestSummarize(t *testing.T) {
	f := setup(t)
	s, err := f.s.Summarize(f.ctx, f.conn)
	if err != nil || s != (store.Summary{}) {
		t.Fatalf("an empty schema: %+v, %v", s, err)
	}
	f.exec(`INSERT INTO ` + schema + `.events (topic, created_at) VALUES ('t', now() - interval '1 hour'), ('t', now()), ('t', now())`)
	f.deadLetter(100, "t", ptr("a"), true, 0, "")
	f.deadLetter(101, "t", ptr("a"), false, 100, "")
	f.deadLetter(102, "t", ptr("a"), false, 100, "")
	f.deadLetter(103, "t", nil, false, 0, "discarded")
	f.exec(`INSERT INTO `+schema+`.events_archive (id, txid, event_id, topic, created_at, published_at)
SELECT i, pg_current_xact_id(), gen_random_uuid(), 't', now(), $1::timestamptz + i * interval '1 second' FROM generate_series(1, 5) AS i`, epoch)
	s, err = f.s.Summarize(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	if s.Backlog != 3 || s.OldestAge < 59*time.Minute || s.OldestAge > 2*time.Hour || s.DeadLetters != 4 || s.HeldKeys != 1 || s.HeldEvents != 2 ||
		s.Archived != 5 || s.ArchiveOldest == nil || !s.ArchiveOldest.Equal(epoch.Add(time.Second)) {
		t.Fatalf("summary %+v", s)
	}

	// The counts are bounded: past ExactCountLimit rows they stop, and the
	// planner's estimate takes over only when it is larger. With the
	// archive never analyzed (autovacuum off for it) there is no
	// estimate, so a count that read every row would say 100,105.
	f.exec(`ALTER TABLE ` + schema + `.events_archive SET (autovacuum_enabled = false)`)
	f.exec(`INSERT INTO ` + schema + `.events_archive (id, txid, event_id, topic, created_at)
SELECT i, pg_current_xact_id(), gen_random_uuid(), 't', now() FROM generate_series(1, 100100) AS i`)
	s, err = f.s.Summarize(f.ctx, f.conn)
	if err != nil || s.Archived != store.ExactCountLimit+1 {
		t.Fatalf("an archive of 100,105 rows never analyzed: %d, %v; want the bound, %d", s.Archived, err, store.ExactCountLimit+1)
	}
	f.exec(`ANALYZE ` + schema + `.events_archive`)
	if s, err = f.s.Summarize(f.ctx, f.conn); err != nil || s.Archived < 100100 {
		t.Fatalf("an archive of 100,105 rows analyzed: %d, %v; want the estimate", s.Archived, err)
	}
}

func TestListSlots(t *testing.T) {
	f := setup(t)
	if ss, err := f.s.ListSlots(f.ctx, f.conn); err != nil || len(ss) != 0 {
		t.Fatalf("no slot: %+v, %v", ss, err)
	}
	const slot = "store_status_slot"
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	t.Cleanup(func() { f.conn.Exec(f.ctx, `SELECT pg_drop_replication_slot($1)`, slot) })
	if ss, err := f.s.ListSlots(f.ctx, f.conn); err != nil || len(ss) != 0 {
		t.Fatalf("a slot the relay did not record: %+v, %v; want none", ss, err)
	}
	f.exec(`INSERT INTO `+schema+`.cdc_slots (slot_name) VALUES ($1)`, slot)
	ss, err := f.s.ListSlots(f.ctx, f.conn)
	if err != nil || len(ss) != 1 || ss[0].Name != slot || ss[0].Active || ss[0].LagBytes == nil || ss[0].RetainedBytes == nil || *ss[0].RetainedBytes < 0 {
		t.Fatalf("the relay's slot: %+v, %v", ss, err)
	}
}
