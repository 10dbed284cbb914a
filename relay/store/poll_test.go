package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay/store"
)

// A second cluster, with track_commit_timestamp = on (a server-start
// setting), for the commit-timestamp reads; started by the first test
// that needs it and stopped by TestMain.
// setupCommitTS is setup on the commit-timestamp cluster.
func setupCommitTS(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	url := pgtest.CommitTimestampDatabase(t)
	conn := pgtest.Connect(t, url)
	pgtest.Migrate(t, conn, schema)
	return &fixture{t: t, ctx: ctx, url: url, conn: conn, s: store.New(schema)}
}

// rowsOf collects what a page read hands over.
func rowsOf(t *testing.T, read func(each func(store.PageRow) bool) error) []store.PageRow {
	t.Helper()
	var out []store.PageRow
	if err := read(func(r store.PageRow) bool { out = append(out, r); return true }); err != nil {
		t.Fatal(err)
	}
	return out
}

func rowIDs(rs []store.PageRow) []int64 {
	out := []int64{}
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestPollSession(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 100)
	byTS, err := p.PrepareSession(f.ctx, f.conn)
	if err != nil || byTS {
		t.Fatalf("session on a server without commit timestamps: byTS %v, %v", byTS, err)
	}
	for setting, want := range map[string]string{"synchronous_commit": "off", "enable_seqscan": "off", "jit": "off"} {
		var got string
		if err := f.conn.QueryRow(f.ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil || got != want {
			t.Fatalf("%s = %q (%v), want %q", setting, got, err, want)
		}
	}
	if err := p.Listen(f.ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	if slept, err := p.Sleep(f.ctx, f.conn); err != nil || !slept {
		t.Fatalf("Sleep = %v, %v", slept, err)
	}
	other := pgtest.Connect(t, f.url)
	if _, err := other.Exec(f.ctx, `INSERT INTO `+schema+`.events (topic) VALUES ('t')`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	n, err := f.conn.WaitForNotification(ctx)
	if err != nil || n.Channel != schema+".events" {
		t.Fatalf("notification %+v, %v", n, err)
	}
	c := setupCommitTS(t)
	if byTS, err := p.PrepareSession(c.ctx, c.conn); err != nil || !byTS {
		t.Fatalf("session on a server with commit timestamps: byTS %v, %v", byTS, err)
	}
}

// TestSleepLock checks migration 013's trigger against the reader's sleep
// lock, as a listener of the outbox's channel sees it: a committed insert
// notifies while a session holds the lock and not otherwise, and the lock
// cannot be taken while a writing transaction is open.
func TestSleepLock(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 100)
	listener := pgtest.Connect(t, f.url)
	if err := p.Listen(f.ctx, listener); err != nil {
		t.Fatal(err)
	}
	reader := pgtest.Connect(t, f.url)
	write := func(tx pgx.Tx) {
		t.Helper()
		if _, err := tx.Exec(f.ctx, `INSERT INTO `+schema+`.events (topic) VALUES ('t')`); err != nil {
			t.Fatal(err)
		}
	}
	commitOne := func() {
		t.Helper()
		tx, err := f.conn.Begin(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		write(tx)
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
	}
	// notified reports whether a notification arrives within a second.
	notified := func() bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(f.ctx, time.Second)
		defer cancel()
		_, err := listener.WaitForNotification(ctx)
		if err != nil && ctx.Err() == nil {
			t.Fatal(err)
		}
		return err == nil
	}
	sleep := func(want bool, when string) {
		t.Helper()
		if slept, err := p.Sleep(f.ctx, reader); err != nil || slept != want {
			t.Fatalf("Sleep = %v, %v %s, want %v", slept, err, when, want)
		}
	}

	commitOne()
	if notified() {
		t.Fatal("an insert notified with no reader asleep")
	}
	sleep(true, "with no writer open")
	commitOne()
	if !notified() {
		t.Fatal("an insert did not notify the sleeping reader")
	}
	if err := p.Wake(f.ctx, reader); err != nil {
		t.Fatal(err)
	}
	if err := p.Wake(f.ctx, reader); err == nil {
		t.Fatal("a second Wake succeeded without the lock")
	}
	commitOne()
	if notified() {
		t.Fatal("an insert notified after the reader woke")
	}

	// An open writing transaction keeps the reader awake until it ends.
	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	write(tx)
	sleep(false, "with a writing transaction open")
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if notified() {
		t.Fatal("a writer that took the lock shared notified")
	}
	sleep(true, "after the writer committed")
}

func TestPollMessagesSlot(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 100)
	check := func(want string) {
		t.Helper()
		slot, found, err := p.MessagesSlot(f.ctx, f.conn)
		if err != nil || found != (want != "") || slot != want {
			t.Fatalf("slot %q, found %v, %v; want %q", slot, found, err, want)
		}
	}
	check("")
	// A row without its slot, and a slot without messages, are no reason
	// to refuse.
	f.exec(`INSERT INTO ` + schema + `.cdc_slots (slot_name, messages) VALUES ('gone', true), ('quiet', false)`)
	f.exec(`SELECT pg_create_logical_replication_slot('quiet', 'pgoutput')`)
	check("")
	f.exec(`SELECT pg_create_logical_replication_slot('gone', 'pgoutput')`)
	check("gone")
}

func TestPollTicksAndFreshReads(t *testing.T) {
	f := setup(t)
	p := store.NewPollReader(schema, 1000)
	fresh := func(prev *string, limit int, tick, prune int64) []store.PageRow {
		return rowsOf(t, func(each func(store.PageRow) bool) error {
			return p.ReadFresh(f.ctx, f.conn, false, prev, limit, tick, prune, each)
		})
	}
	if n, err := p.MaxTick(f.ctx, f.conn); err != nil || n != 0 {
		t.Fatalf("max tick of an empty table %d, %v", n, err)
	}
	if rs := fresh(nil, 10, 1, 0); len(rs) != 0 || f.one(`SELECT count(*) FROM `+schema+`.poll_ticks`) != 0 {
		t.Fatalf("a fresh read of an empty outbox returned %d rows or recorded its tick", len(rs))
	}
	first := f.events(3, "t", ptr("k"))
	rs := fresh(nil, 10, 1, 0)
	if !slices.Equal(rowIDs(rs), first) || rs[0].Snapshot == nil || rs[1].Snapshot != nil {
		t.Fatalf("first fresh read %v: want %v with the snapshot on the first row only", rowIDs(rs), first)
	}
	if r := rs[0]; r.Topic != "t" || *r.Key != "k" || string(r.Payload) != "p1" || *r.Headers != `{"h": "v"}` || r.Size != 1+2+10 {
		t.Fatalf("row %+v", r)
	}
	snap1 := *rs[0].Snapshot
	// A transaction running at snap1 commits its row after later ones: the
	// next batch (visible now, not in snap1) has it, and the later rows.
	late := pgtest.Connect(t, f.url)
	ltx, _ := late.Begin(f.ctx)
	var lateID int64
	if err := ltx.QueryRow(f.ctx, `INSERT INTO `+schema+`.events (topic) VALUES ('late') RETURNING id`).Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	// A transaction that commits after the late one took its txid puts
	// that txid below the next snapshot's xmax: in its running list.
	f.events(1, "t", nil)
	rs = fresh(nil, 10, 2, 0)
	snapRunning := *rs[0].Snapshot
	more := f.events(2, "t", nil)
	if err := ltx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	var inXip bool
	if err := f.conn.QueryRow(f.ctx, `SELECT e.txid = ANY (SELECT pg_snapshot_xip($1::text::pg_snapshot)) FROM `+schema+`.events e WHERE e.id = $2`,
		snapRunning, lateID).Scan(&inXip); err != nil || !inXip {
		t.Fatalf("the late transaction is not in the running list of the snapshot it ran in (%v): the test does not test the delta's xip part", err)
	}
	rs = fresh(&snapRunning, 10, 3, 0)
	snap3 := *rs[0].Snapshot
	if want := append([]int64{lateID}, more...); !slices.Equal(rowIDs(rs), want) {
		t.Fatalf("delta after a late commit %v, want %v", rowIDs(rs), want)
	}
	// The limit, and a read that stops early still records its tick.
	rs = fresh(&snap1, 2, 4, 0)
	if len(rs) != 2 {
		t.Fatalf("limited read: %d rows", len(rs))
	}
	stopped := 0
	if err := p.ReadFresh(f.ctx, f.conn, false, &snap1, 10, 5, 3, func(store.PageRow) bool { stopped++; return false }); err != nil || stopped != 1 {
		t.Fatalf("a read stopped after its first row: %d rows, %v", stopped, err)
	}
	// Ticks 1..5 were recorded (not the empty read's), then those below 3
	// pruned by the last read.
	ticks, err := p.LoadTicks(f.ctx, f.conn, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ns []int64
	for _, tk := range ticks {
		ns = append(ns, tk.N)
		if tk.ByTS || tk.Snapshot == "" {
			t.Fatalf("tick %+v", tk)
		}
	}
	if !slices.Equal(ns, []int64{3, 4, 5}) || ticks[0].Snapshot != snap3 {
		t.Fatalf("ticks %v, want [3 4 5]", ns)
	}
	if from4, _ := p.LoadTicks(f.ctx, f.conn, 4); len(from4) != 2 || from4[0].N != 4 {
		t.Fatalf("ticks from 4: %+v", from4)
	}
	if n, _ := p.MaxTick(f.ctx, f.conn); n != 5 {
		t.Fatalf("max tick %d", n)
	}
	if err := p.PruneTicks(f.ctx, f.conn, 5); err != nil || f.one(`SELECT min(tick) FROM `+schema+`.poll_ticks`) != 5 {
		t.Fatalf("prune below 5: %v", err)
	}
	if err := p.ClearTicks(f.ctx, f.conn); err != nil || f.one(`SELECT count(*) FROM `+schema+`.poll_ticks`) != 0 {
		t.Fatalf("clear: %v", err)
	}
}

// pgtestConn is another connection to f's database.
func pgtestConn(f *fixture) *pgx.Conn { return pgtest.Connect(f.t, f.url) }
