package store_test

// The WAL reader's statements (store.CDCReader): the preflight, the
// publication, the replication slots, the lag and the heartbeat, against
// the package's cluster (wal_level = logical). Slots belong to the
// cluster, so each test names its own and drops what its database's
// cleanup does not.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/outboxrelay/relay/relay/store"
)

// slotName is a slot name of this process for the calling test.
func slotName(what string) string {
	return fmt.Sprintf("store_%s_%d", what, os.Getpid())
}

// text runs a query returning one text column of one row.
func (f *fixture) text(sql string, args ...any) string {
	f.t.Helper()
	var s string
	if err := f.conn.QueryRow(f.ctx, sql, args...).Scan(&s); err != nil {
		f.t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestCDCPreflight(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	if level, err := c.WALLevel(f.ctx, f.conn); err != nil || level != "logical" {
		t.Fatalf("wal_level %q, %v", level, err)
	}
	if name, super, repl, err := c.Role(f.ctx, f.conn); err != nil || name != f.text(`SELECT current_user::text`) || !super || !repl {
		t.Fatalf("the test's superuser: %q super %v replication %v, %v", name, super, repl, err)
	}
	// Roles belong to the cluster: named for this process, dropped after.
	plain, repl := fmt.Sprintf("store_plain_%d", os.Getpid()), fmt.Sprintf("store_repl_%d", os.Getpid())
	f.exec(`CREATE ROLE ` + plain + ` NOLOGIN`)
	f.exec(`CREATE ROLE ` + repl + ` NOLOGIN REPLICATION`)
	t.Cleanup(func() {
		f.conn.Exec(context.Background(), `RESET ROLE`)
		f.conn.Exec(context.Background(), `DROP ROLE `+plain+`, `+repl)
	})
	for _, want := range []struct {
		role        string
		replication bool
	}{{plain, false}, {repl, true}} {
		f.exec(`SET ROLE ` + want.role)
		name, super, replication, err := c.Role(f.ctx, f.conn)
		if err != nil || name != want.role || super || replication != want.replication {
			t.Fatalf("as %s: %q super %v replication %v, %v", want.role, name, super, replication, err)
		}
	}
	f.exec(`RESET ROLE`)
	if ok, err := c.OutboxExists(f.ctx, f.conn); err != nil || !ok {
		t.Fatalf("the migrated outbox: exists %v, %v", ok, err)
	}
	if ok, err := store.NewCDCReader("no_such_schema").OutboxExists(f.ctx, f.conn); err != nil || ok {
		t.Fatalf("an outbox never migrated: exists %v, %v", ok, err)
	}
}

func TestCDCPublication(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	check := func(c *store.CDCReader, pub string, want store.Publication, wantFound bool) {
		t.Helper()
		p, found, err := c.Publication(f.ctx, f.conn, pub)
		if err != nil || found != wantFound || p != want {
			t.Fatalf("publication %s: %+v found %v, %v; want %+v found %v", pub, p, found, err, want, wantFound)
		}
	}
	check(c, "store_pub", store.Publication{}, false)
	if err := c.CreatePublication(f.ctx, f.conn, "store_pub"); err != nil {
		t.Fatal(err)
	}
	var ins, upd, del, trunc bool
	if err := f.conn.QueryRow(f.ctx, `SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication WHERE pubname = 'store_pub'`).
		Scan(&ins, &upd, &del, &trunc); err != nil || !ins || upd || del || trunc {
		t.Fatalf("the created publication publishes insert %v update %v delete %v truncate %v (%v), want inserts only", ins, upd, del, trunc, err)
	}
	if tables := f.text(`SELECT string_agg(schemaname || '.' || tablename, ',') FROM pg_publication_tables WHERE pubname = 'store_pub'`); tables != schema+".events" {
		t.Fatalf("the created publication has tables %q", tables)
	}
	check(c, "store_pub", store.Publication{Inserts: true, Covers: true}, true)
	// The code the WAL reader reads as "created meanwhile by another".
	if err := c.CreatePublication(f.ctx, f.conn, "store_pub"); pgCode(err) != "42710" {
		t.Fatalf("creating it again: %v, want 42710", err)
	}
	f.exec(`CREATE PUBLICATION store_pub_upd FOR TABLE ` + schema + `.events WITH (publish = 'update')`)
	check(c, "store_pub_upd", store.Publication{Covers: true}, true)
	// An events table of another schema, and another table of this one,
	// are not the outbox.
	f.exec(`CREATE SCHEMA other`)
	f.exec(`CREATE TABLE other.events (id int)`)
	f.exec(`CREATE TABLE ` + schema + `.not_events (id int)`)
	f.exec(`CREATE PUBLICATION store_pub_other FOR TABLE other.events, ` + schema + `.not_events`)
	check(c, "store_pub_other", store.Publication{Inserts: true}, true)
	check(store.NewCDCReader("other"), "store_pub_other", store.Publication{Inserts: true, Covers: true}, true)
}

// streamFrom holds slot active with a walsender, as the WAL reader does,
// and returns the walsender's pid; the connection closes when the test
// ends.
func streamFrom(t *testing.T, url, slot, pub string) int32 {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"},
	}); err != nil {
		t.Fatal(err)
	}
	return int32(conn.PID())
}

func TestCDCSlots(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	name, physical := slotName("logical"), slotName("physical")
	if _, found, err := c.Slot(f.ctx, f.conn, name); err != nil || found {
		t.Fatalf("a missing slot: found %v, %v", found, err)
	}
	// A physical slot that reserved nothing: it counts, and has NULLs
	// where a logical one has values.
	f.exec(`SELECT pg_create_physical_replication_slot($1)`, physical)
	t.Cleanup(func() { f.conn.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, physical) })
	used, limit, err := c.SlotCount(f.ctx, f.conn)
	if err != nil || int64(used) != f.one(`SELECT count(*) FROM pg_replication_slots`) || fmt.Sprint(limit) != f.text(`SHOW max_replication_slots`) {
		t.Fatalf("slot count %d of %d, %v", used, limit, err)
	}
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name)
	if after, _, _ := c.SlotCount(f.ctx, f.conn); after != used+1 {
		t.Fatalf("slot count after a creation %d, before %d", after, used)
	}
	st, found, err := c.Slot(f.ctx, f.conn, name)
	want := store.ReplicationSlot{Plugin: "pgoutput", Type: "logical", Database: f.text(`SELECT current_database()::text`), WALStatus: "reserved",
		ConfirmedFlush: f.text(`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, name)}
	if err != nil || !found || st != want || st.ConfirmedFlush == "" {
		t.Fatalf("slot %+v found %v, %v; want %+v", st, found, err, want)
	}
	if st, found, err := c.Slot(f.ctx, f.conn, physical); err != nil || !found || st != (store.ReplicationSlot{Type: "physical"}) {
		t.Fatalf("physical slot %+v found %v, %v", st, found, err)
	}

	f.exec(`CREATE PUBLICATION store_pub FOR TABLE ` + schema + `.events`)
	pid := streamFrom(t, f.url, name, "store_pub")
	testwait.Until(t, 10*time.Second, "the walsender to hold the slot", func() error {
		if st, _, _ = c.Slot(f.ctx, f.conn, name); st.ActivePID != pid {
			return fmt.Errorf("active pid %d, the walsender is %d", st.ActivePID, pid)
		}
		return nil
	})
	// The codes the WAL reader tells apart: a slot held by a walsender,
	// and a slot already gone.
	if err := c.DropSlot(f.ctx, f.conn, name); pgCode(err) != "55006" {
		t.Fatalf("dropping an active slot: %v, want 55006", err)
	}
	if err := c.DropSlot(f.ctx, f.conn, physical); err != nil {
		t.Fatal(err)
	}
	if _, found, err := c.Slot(f.ctx, f.conn, physical); err != nil || found {
		t.Fatalf("a dropped slot: found %v, %v", found, err)
	}
	if err := c.DropSlot(f.ctx, f.conn, physical); pgCode(err) != "42704" {
		t.Fatalf("dropping a missing slot: %v, want 42704", err)
	}
}

func TestCDCSlotLagAndHeartbeat(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	name, physical := slotName("lag"), slotName("unreserved")
	if _, _, found, err := c.SlotLag(f.ctx, f.conn, name); err != nil || found {
		t.Fatalf("lag of a missing slot: found %v, %v", found, err)
	}
	f.exec(`SELECT pg_create_physical_replication_slot($1)`, physical)
	t.Cleanup(func() { f.conn.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, physical) })
	if lag, retained, found, err := c.SlotLag(f.ctx, f.conn, physical); err != nil || !found || lag != 0 || retained != 0 {
		t.Fatalf("lag of a slot without positions: %d, %d, found %v, %v", lag, retained, found, err)
	}
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name)
	f.exec(`CREATE PUBLICATION store_pub FOR TABLE ` + schema + `.events`)
	f.exec(`CREATE TABLE store_flush (i int)`)
	if err := c.Heartbeat(f.ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	// The message's WAL is not flushed by itself, and decoding reads only
	// flushed WAL: a commit flushes it (an empty transaction for pgoutput,
	// the table not being published).
	f.exec(`INSERT INTO store_flush VALUES (1)`)
	// The heartbeat is one non-transactional message (flags 0) with the
	// prefix relay-heartbeat and no content.
	rows, err := f.conn.Query(f.ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
    'proto_version', '1', 'publication_names', 'store_pub', 'messages', 'true')`, name)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		t.Fatal(err)
	}
	// Servers before 15 send the flushing transaction too, empty.
	var msgs [][]byte
	for _, c := range changes {
		if len(c) > 0 && c[0] == 'M' {
			msgs = append(msgs, c)
		}
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages after a heartbeat, want one", len(msgs))
	}
	// 'M', flags, LSN (8 bytes), prefix, 0, content length (4 bytes).
	if m := msgs[0]; m[0] != 'M' || m[1] != 0 || !bytes.Equal(m[10:], []byte("relay-heartbeat\x00\x00\x00\x00\x00")) {
		t.Fatalf("heartbeat message %q", m)
	}
	// lag and retained are measured from the same current position; the
	// slot's own positions do not move while nothing reads it.
	behind := `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`
	before := f.one(behind, name)
	lag, retained, found, err := c.SlotLag(f.ctx, f.conn, name)
	after := f.one(behind, name)
	if err != nil || !found || lag <= 0 || lag < before || lag > after {
		t.Fatalf("lag %d (found %v, %v), want between %d and %d", lag, found, err, before, after)
	}
	if d := f.one(`SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, name); retained-lag != d {
		t.Fatalf("retained %d - lag %d = %d, want the slot's confirmed - restart %d", retained, lag, retained-lag, d)
	}
}

func TestCDCSlotNameFactsAndDatabase(t *testing.T) {
	f := setup(t)
	c := store.NewCDCReader(schema)
	cfg, err := pgx.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	if db, err := c.Database(f.ctx, f.conn); err != nil || db != cfg.Database {
		t.Fatalf("database %q, %v; the URL names %q", db, err, cfg.Database)
	}
	legacy := slotName("legacy")
	facts := func(wantLegacy bool) {
		t.Helper()
		oid, here, err := c.SlotNameFacts(f.ctx, f.conn, legacy)
		if err != nil || int64(oid) != f.one(`SELECT oid::bigint FROM pg_database WHERE datname = $1`, cfg.Database) || here != wantLegacy {
			t.Fatalf("oid %d, legacy slot here %v, %v; want %v", oid, here, err, wantLegacy)
		}
	}
	facts(false)
	// The legacy name in another database of the cluster is not this
	// database's slot.
	other := pgtest.Connect(t, pgtest.NewDatabase(t))
	if _, err := other.Exec(f.ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, legacy); err != nil {
		t.Fatal(err)
	}
	facts(false)
	if _, err := other.Exec(f.ctx, `SELECT pg_drop_replication_slot($1)`, legacy); err != nil {
		t.Fatal(err)
	}
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, legacy)
	facts(true)
}
