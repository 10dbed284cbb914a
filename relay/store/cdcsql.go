package store

// The WAL reader's statements (cdc/ runs them on ordinary connections
// beside its replication connection; its package doc says what they
// guarantee). The replication commands themselves (IDENTIFY_SYSTEM,
// CREATE_REPLICATION_SLOT, START_REPLICATION) are not SQL and stay in
// cdc/.

import (
	"strconv"

	"github.com/jackc/pgx/v5"
)

// CDCTablePage is how many rows one read of the table after a slot's
// creation returns (CDCReader.ReadTablePage).
const CDCTablePage = 1000

// cdcSQL are the WAL reader's statements for one schema.
type cdcSQL struct {
	// table is <schema>.events, quoted: the name the publication and the
	// preflight give it.
	table string

	walLevel, role, outboxExists, publication string
	slot, slotCount, slotNameFacts, database  string
	dropSlot, lag, heartbeat                  string
	mark, beginMark, completeMark, markRead   string
	deleteMark                                string
	currentSnapshot, rowsLeft, tablePage      string
}

func newCDCSQL(schema string) cdcSQL {
	table := pgx.Identifier{schema, "events"}.Sanitize()
	slots := pgx.Identifier{schema, "cdc_slots"}.Sanitize()
	return cdcSQL{
		table: table,

		walLevel:     "SELECT current_setting('wal_level')",
		role:         "SELECT rolname, rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user",
		outboxExists: "SELECT to_regclass($1) IS NOT NULL",
		publication: `SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_publication_tables t
    WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = 'events')
FROM pg_publication p WHERE p.pubname = $1`,

		slot: `SELECT plugin, slot_type, database, active_pid, wal_status, confirmed_flush_lsn::text
FROM pg_replication_slots WHERE slot_name = $1`,
		slotCount: `SELECT (SELECT count(*) FROM pg_replication_slots)::int, current_setting('max_replication_slots')::int`,
		slotNameFacts: `SELECT d.oid, EXISTS (SELECT 1 FROM pg_replication_slots
    WHERE slot_name = $1 AND database = current_database())
FROM pg_database AS d WHERE d.datname = current_database()`,
		database: "SELECT current_database()",
		dropSlot: "SELECT pg_drop_replication_slot($1)",
		lag: `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1`,
		heartbeat: "SELECT pg_logical_emit_message(false, 'relay-heartbeat', '')",

		mark: "SELECT consistent_lsn::text, snapshot::text FROM " + slots + " WHERE slot_name = $1",
		beginMark: "INSERT INTO " + slots + ` (slot_name) VALUES ($1)
ON CONFLICT (slot_name) DO UPDATE SET consistent_lsn = NULL, snapshot = NULL, created_at = now()`,
		completeMark: "UPDATE " + slots + " SET consistent_lsn = $2::text::pg_lsn, snapshot = $3::text::pg_snapshot WHERE slot_name = $1",
		markRead:     "UPDATE " + slots + " SET snapshot = NULL WHERE slot_name = $1 AND consistent_lsn = $2::text::pg_lsn",
		deleteMark:   "DELETE FROM " + slots + " WHERE slot_name = $1",

		currentSnapshot: "SELECT pg_current_snapshot()::text",
		rowsLeft:        "SELECT EXISTS (SELECT 1 FROM " + table + " WHERE pg_visible_in_snapshot(txid, $1::text::pg_snapshot))",
		// The text form of txid gets its own name: a bare "ORDER BY txid"
		// would sort by an output column called txid, that is by text,
		// where "1000" < "999", and the (txid, id) cursor would then
		// repeat and skip rows.
		tablePage: `SELECT e.id, e.txid::text AS txid_text, e.event_id::text, e.topic, e.key, e.payload, e.headers::text, e.created_at
FROM ` + table + ` AS e
WHERE pg_visible_in_snapshot(e.txid, $1::text::pg_snapshot) AND (e.txid, e.id) > ($2::text::xid8, $3)
ORDER BY e.txid, e.id
LIMIT ` + strconv.Itoa(CDCTablePage),
	}
}

// createPublication creates the publication pub (a name the caller
// checked: it goes into the text as it is).
func (q cdcSQL) createPublication(pub string) string {
	return "CREATE PUBLICATION " + pub + " FOR TABLE " + q.table + " WITH (publish = 'insert')"
}

// importSnapshot makes the transaction see the exported snapshot name.
func importSnapshot(name string) string {
	return "SET TRANSACTION SNAPSHOT '" + name + "'"
}
