package store_test

// The WAL reader's slot creation records, the import of a slot's exported
// snapshot, and the read of the table's rows from before a slot
// (store.CDCReader).

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

func TestCDCMarks(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	check := func(slot string, want store.SlotMark, wantFound bool) {
		t.Helper()
		m, found, err := c.Mark(f.ctx, f.conn, slot)
		if err != nil || found != wantFound || m != want {
			t.Fatalf("mark of %s: %+v found %v, %v; want %+v found %v", slot, m, found, err, want, wantFound)
		}
	}
	check("a", store.SlotMark{}, false)
	for _, slot := range []string{"a", "b"} {
		if err := c.BeginMark(f.ctx, f.conn, slot); err != nil {
			t.Fatal(err)
		}
	}
	check("a", store.SlotMark{}, true)
	done := store.SlotMark{ConsistentLSN: "0/16B3748", Snapshot: "10:20:12,15"}
	if err := c.CompleteMark(f.ctx, f.conn, "a", done.ConsistentLSN, done.Snapshot); err != nil {
		t.Fatal(err)
	}
	check("a", done, true)
	check("b", store.SlotMark{}, true)
	// The table read of another consistent point does not finish this one.
	if err := c.MarkTableRead(f.ctx, f.conn, "a", "0/16B3749"); err != nil {
		t.Fatal(err)
	}
	check("a", done, true)
	if err := c.MarkTableRead(f.ctx, f.conn, "a", done.ConsistentLSN); err != nil {
		t.Fatal(err)
	}
	check("a", store.SlotMark{ConsistentLSN: done.ConsistentLSN}, true)
	// A new creation forgets the old one, and is dated now.
	if err := c.CompleteMark(f.ctx, f.conn, "a", done.ConsistentLSN, done.Snapshot); err != nil {
		t.Fatal(err)
	}
	f.exec(`UPDATE ` + schema + `.cdc_slots SET created_at = now() - interval '1 day'`)
	if err := c.BeginMark(f.ctx, f.conn, "a"); err != nil {
		t.Fatal(err)
	}
	check("a", store.SlotMark{}, true)
	if n := f.one(`SELECT count(*) FROM ` + schema + `.cdc_slots WHERE created_at > now() - interval '1 hour'`); n != 1 {
		t.Fatalf("%d records dated now, want the one begun again", n)
	}
	if err := c.DeleteMark(f.ctx, f.conn, "a"); err != nil {
		t.Fatal(err)
	}
	check("a", store.SlotMark{}, false)
	check("b", store.SlotMark{}, true)
	// A schema never migrated: the code the WAL reader reports as such.
	absent := store.NewCDCReader("no_such_schema")
	if _, _, err := absent.Mark(f.ctx, f.conn, "a"); pgCode(err) != "42P01" {
		t.Fatalf("reading a record without the table: %v, want 42P01", err)
	}
	if err := absent.BeginMark(f.ctx, f.conn, "a"); pgCode(err) != "42P01" {
		t.Fatalf("writing a record without the table: %v, want 42P01", err)
	}
}

func TestCDCImportSnapshot(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	exporter := pgtestConn(f)
	etx, err := exporter.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer etx.Rollback(f.ctx)
	var name, exported string
	if err := etx.QueryRow(f.ctx, `SELECT pg_export_snapshot(), pg_current_snapshot()::text`).Scan(&name, &exported); err != nil {
		t.Fatal(err)
	}
	// A commit after the export is not in the snapshot.
	f.events(1, "after", nil)
	var got string
	var rows int64
	err = pgx.BeginTxFunc(f.ctx, pgtestConn(f), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		if got, err = c.ImportSnapshot(f.ctx, tx, name); err != nil {
			return err
		}
		return tx.QueryRow(f.ctx, `SELECT count(*) FROM `+schema+`.events`).Scan(&rows)
	})
	if err != nil || got != exported || rows != 0 {
		t.Fatalf("imported %q seeing %d rows, %v; exported %q with none", got, rows, err, exported)
	}
}

func TestCDCTableRows(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	snapshot := func() string { return f.text(`SELECT pg_current_snapshot()::text`) }
	empty := snapshot()
	// Transaction a takes its txid first and commits last: its rows come
	// first, in id order, around b's.
	a := pgtestConn(f)
	atx, err := a.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer atx.Rollback(f.ctx)
	insert := func(db store.DB, topic string, key *string) int64 {
		t.Helper()
		var id int64
		if err := db.QueryRow(f.ctx, `INSERT INTO `+schema+`.events (topic, key, payload, headers) VALUES ($1, $2, 'p', '{"h": "v"}') RETURNING id`,
			topic, key).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	a1 := insert(atx, "a", ptr("k"))
	b := f.events(1, "b", nil)[0]
	a2 := insert(atx, "a", nil)
	if err := atx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	before := snapshot()
	f.events(1, "later", nil)
	for snap, want := range map[string]bool{empty: false, before: true} {
		if left, err := c.RowsLeft(f.ctx, f.conn, snap); err != nil || left != want {
			t.Fatalf("rows left in %s: %v, %v; want %v", snap, left, err, want)
		}
	}
	read := func(snap, afterTxid string, afterID int64) []store.TableRow {
		t.Helper()
		page, err := c.ReadTablePage(f.ctx, f.conn, snap, afterTxid, afterID)
		if err != nil {
			t.Fatal(err)
		}
		return page
	}
	idsOf := func(rs []store.TableRow) []int64 {
		out := []int64{}
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	page := read(before, "0", 0)
	if !slices.Equal(idsOf(page), []int64{a1, a2, b}) {
		t.Fatalf("rows before the snapshot %v, want %v", idsOf(page), []int64{a1, a2, b})
	}
	for _, r := range page {
		var txid, eventID, topic string
		var key, headers *string
		var payload []byte
		var created time.Time
		if err := f.conn.QueryRow(f.ctx, `SELECT txid::text, event_id::text, topic, key, payload, headers::text, created_at FROM `+schema+`.events WHERE id = $1`, r.ID).
			Scan(&txid, &eventID, &topic, &key, &payload, &headers, &created); err != nil {
			t.Fatal(err)
		}
		if r.Txid != txid || r.EventID != eventID || r.Topic != topic || string(payload) != string(r.Payload) || !r.CreatedAt.Equal(created) ||
			(key == nil) != (r.Key == nil) || key != nil && *key != string(r.Key) || headers == nil || *headers != string(r.Headers) {
			t.Fatalf("row %+v, the table has txid %s event %s topic %s key %v payload %q headers %v created %v", r, txid, eventID, topic, key, payload, headers, created)
		}
	}
	if page[0].Txid != page[1].Txid || page[0].Txid == page[2].Txid {
		t.Fatalf("txids %s %s %s: a's rows share one, b's is another", page[0].Txid, page[1].Txid, page[2].Txid)
	}
	if got := idsOf(read(before, page[0].Txid, a1)); !slices.Equal(got, []int64{a2, b}) {
		t.Fatalf("rows after a's first %v, want %v", got, []int64{a2, b})
	}
	if got := read(before, page[2].Txid, b); len(got) != 0 {
		t.Fatalf("rows after the last %v", idsOf(got))
	}
	// A page holds store.CDCTablePage rows; the next starts after it.
	if err := f.fenced(func(tx pgx.Tx) error {
		_, err := tx.Exec(f.ctx, `DELETE FROM `+schema+`.events`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	many := f.events(store.CDCTablePage+1, "many", nil)
	now := snapshot()
	first := read(now, "0", 0)
	if !slices.Equal(idsOf(first), many[:store.CDCTablePage]) {
		t.Fatalf("first page of %d rows: %d rows", len(many), len(first))
	}
	last := first[len(first)-1]
	if rest := read(now, last.Txid, last.ID); !slices.Equal(idsOf(rest), many[store.CDCTablePage:]) {
		t.Fatalf("second page %v, want %v", idsOf(rest), many[store.CDCTablePage:])
	}
}

// TestCDCTableRowsInTxidOrder: rows whose txids cross a power of ten
// (999 to 1000, say) are read in txid order, which their text forms are
// not.
func TestCDCTableRowsInTxidOrder(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	next := f.one(`SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`)
	boundary := int64(10)
	for boundary <= next+5 {
		boundary *= 10
	}
	if boundary-next > 200000 {
		t.Skipf("the next txid %d is %d from a power of ten: too many to use up", next, boundary-next)
	}
	// Each transaction of the loops takes a txid: use them up to five
	// below the boundary, then write one row per transaction across it.
	f.exec(fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`, boundary-5-next))
	f.exec(`DO $$ BEGIN FOR i IN 1..10 LOOP INSERT INTO ` + schema + `.events (topic) VALUES ('t'); COMMIT; END LOOP; END $$`)
	txids := f.int64s(`SELECT txid::text::bigint FROM ` + schema + `.events ORDER BY id`)
	if txids[0] >= boundary || txids[len(txids)-1] < boundary {
		t.Fatalf("txids %v do not cross %d: the test does not test the order", txids, boundary)
	}
	page, err := c.ReadTablePage(f.ctx, f.conn, f.text(`SELECT pg_current_snapshot()::text`), "0", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, r := range page {
		var n int64
		fmt.Sscan(r.Txid, &n)
		got = append(got, n)
	}
	if !slices.Equal(got, txids) {
		t.Fatalf("rows read in txid order %v, want %v", got, txids)
	}
}
