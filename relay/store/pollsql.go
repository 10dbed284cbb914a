package store

// The poll reader's statements (poller/ reads the outbox with them; its
// package doc says why they are shaped so, and what they guarantee).

import (
	"strconv"

	"github.com/jackc/pgx/v5"
)

// pollSQL are the poll reader's statements for one schema (poller/).
//
// A batch is defined by s(cur, prev): the rows whose transaction is visible
// in cur and not in prev (every visible row when prev is NULL). Two ways to
// find them:
//   - delta: the transactions that may be new in cur are those running in
//     prev (its xip list) and those that started after it (txid at or above
//     its xmax); both are index lookups on (txid, id), so a live read costs
//     what the new rows cost, however old the oldest running transaction.
//     The xip list is joined laterally, one index lookup per transaction
//     id, kept from being flattened into a join by OFFSET 0: as "txid = ANY
//     (xip)", or as a plain join, the generic plan of the prepared
//     statement scanned the primary key from the page cursor or the whole
//     table (every row of the outbox, acknowledged rows not yet vacuumed
//     included) instead, milliseconds per read under a steady load;
//   - scan: the rows in primary-key order from a cursor, filtered by
//     visibility: for batches too large to sort, and the first batch after a
//     start.
type pollSQL struct {
	freshIDDelta, freshIDScan, freshTSDelta, freshTSScan string
	firstID, scanID, firstTS                             string
	keysDelta, keysAll, fetch                            string
	maxTick, loadTicks, clearTicks, prune                string
}

const (
	pageCols = `page.id, page.event_id, page.topic, page.key, page.payload, page.headers, page.created_at, page.sz`
	// commitKey is the commit timestamp in microseconds; the 32-bit xid
	// the function takes is the xid8's low half, right for any transaction
	// less than two billion transactions old.
	commitKey = `CROSS JOIN LATERAL (SELECT coalesce((extract(epoch FROM pg_xact_commit_timestamp(e.txid::xid)) * 1000000)::bigint, -9223372036854775808) AS ck) AS k`
	tsOrder   = `k.ck, e.txid, e.id`
)

func newPollSQL(schema string, message int64) pollSQL {
	events := pgx.Identifier{schema, "events"}.Sanitize()
	cols := eventCols(message)
	ticks := pgx.Identifier{schema, "poll_ticks"}.Sanitize()

	// Each yields the batch's rows as e (joined to s).
	delta := `s CROSS JOIN LATERAL (
    SELECT e.* FROM ` + events + ` AS e
    WHERE e.txid >= pg_snapshot_xmax(s.prev) AND e.txid < pg_snapshot_xmax(s.cur)
    UNION ALL
    SELECT e.* FROM pg_snapshot_xip(s.prev) AS x(txid)
    CROSS JOIN LATERAL (SELECT e.* FROM ` + events + ` AS e WHERE e.txid = x.txid OFFSET 0) AS e
) AS e ` + rowSize
	deltaWhere := `pg_visible_in_snapshot(e.txid, s.cur)`
	scan := `s CROSS JOIN ` + events + ` AS e ` + rowSize
	scanWhere := `pg_visible_in_snapshot(e.txid, s.cur) AND (s.prev IS NULL OR NOT pg_visible_in_snapshot(e.txid, s.prev))`

	freshS := `s AS (SELECT pg_current_snapshot() AS cur, $1::text::pg_snapshot AS prev)`
	givenS := `s AS (SELECT $2::text::pg_snapshot AS cur, $1::text::pg_snapshot AS prev)`

	// fresh reads the first page of a new tick's batch and records the tick
	// when the page has rows; the tick number and the prune bound are the
	// last two parameters.
	fresh := func(page, order string, byTS bool, nArg, pruneArg string) string {
		tsCols := ""
		flag := "false"
		if byTS {
			tsCols = ", page.ck, page.txid::text"
			flag = "true"
		}
		return `WITH ` + freshS + `,
page AS MATERIALIZED (` + page + `),
t AS (INSERT INTO ` + ticks + ` (tick, snapshot, by_commit_ts)
    SELECT ` + nArg + `::bigint, s.cur, ` + flag + ` FROM s WHERE EXISTS (SELECT 1 FROM page)),
d AS (DELETE FROM ` + ticks + ` WHERE tick < ` + pruneArg + `::bigint)
SELECT CASE WHEN row_number() OVER () = 1 THEN (SELECT s.cur::text FROM s) END AS snap,
    ` + pageCols + tsCols + `
FROM page ORDER BY ` + order
	}
	idPage := func(from, where string) string {
		return `SELECT ` + cols + ` FROM ` + from + ` WHERE ` + where + ` AND e.id > $2 ORDER BY e.id LIMIT $3`
	}
	tsPage := func(from, where, limit string) string {
		return `SELECT ` + cols + `, k.ck, e.txid FROM ` + from + ` ` + commitKey + ` WHERE ` + where + ` ORDER BY ` + tsOrder + ` LIMIT ` + limit
	}
	given := func(page string) string { return `WITH ` + givenS + ` ` + page }

	return pollSQL{
		freshIDDelta: fresh(idPage(delta, deltaWhere), "page.id", false, "$4", "$5"),
		freshIDScan:  fresh(idPage(scan, scanWhere), "page.id", false, "$4", "$5"),
		freshTSDelta: fresh(tsPage(delta, deltaWhere, "$2"), pageTSOrder, true, "$3", "$4"),
		freshTSScan:  fresh(tsPage(scan, scanWhere, "$2"), pageTSOrder, true, "$3", "$4"),
		firstID: given(`SELECT ` + cols + ` FROM ` + delta + ` WHERE ` + deltaWhere +
			` AND e.id > $3 ORDER BY e.id LIMIT $4`),
		scanID: given(`SELECT ` + cols + ` FROM ` + scan + ` WHERE ` + scanWhere +
			` AND e.id > $3 ORDER BY e.id LIMIT $4`),
		firstTS: given(`SELECT ` + cols + `, k.ck, e.txid::text AS txid FROM ` + delta + ` ` + commitKey + ` WHERE ` + deltaWhere +
			` ORDER BY ` + tsOrder + ` LIMIT $3`),
		keysDelta: given(`SELECT e.id, z.sz FROM ` + delta + ` ` + commitKey + ` WHERE ` + deltaWhere +
			` AND (k.ck, e.txid, e.id) > ($3, $4::text::xid8, $5) ORDER BY ` + tsOrder),
		keysAll: given(`SELECT e.id, z.sz FROM ` + scan + ` ` + commitKey + ` WHERE ` + scanWhere +
			` AND (k.ck, e.txid, e.id) > ($3, $4::text::xid8, $5) ORDER BY ` + tsOrder),
		fetch:      `SELECT ` + cols + ` FROM ` + events + ` AS e ` + rowSize + ` WHERE e.id = ANY($1::bigint[])`,
		maxTick:    `SELECT coalesce(max(tick), 0) FROM ` + ticks,
		loadTicks:  `SELECT tick, snapshot::text, by_commit_ts FROM ` + ticks + ` WHERE tick >= $1 ORDER BY tick`,
		clearTicks: `DELETE FROM ` + ticks,
		prune:      `DELETE FROM ` + ticks + ` WHERE tick < $1`,
	}
}

func (q pollSQL) freshID(scan bool) string {
	if scan {
		return q.freshIDScan
	}
	return q.freshIDDelta
}

func (q pollSQL) freshTS(scan bool) string {
	if scan {
		return q.freshTSScan
	}
	return q.freshTSDelta
}

// rowSize joins each row e to its size z.sz.
const rowSize = `CROSS JOIN LATERAL (SELECT coalesce(octet_length(e.key), 0)::bigint + coalesce(octet_length(e.payload), 0)
    + coalesce(octet_length(e.headers::text), 0) AS sz) AS z`

// pageTSOrder is the commit-timestamp order of a page's rows; txid may be
// text or xid8 there.
const pageTSOrder = `page.ck, page.txid::text::xid8, page.id`

// eventCols are the columns of an event read from e joined to z: its
// content only when it is within the message limit, and its size.
func eventCols(message int64) string {
	limit := strconv.FormatInt(message, 10)
	fits := `CASE WHEN z.sz <= ` + limit + ` THEN `
	// The key of a row too large comes when the key alone is within the
	// limit: the dead-letter policy holds events by key.
	keyFits := `CASE WHEN coalesce(octet_length(e.key), 0) <= ` + limit + ` THEN `
	return `e.id, e.event_id::text AS event_id, e.topic, ` + keyFits + `e.key END AS key, ` + fits + `e.payload END AS payload, ` +
		fits + `e.headers::text END AS headers, e.created_at, z.sz`
}
