package poller

import (
	"strconv"

	"github.com/outboxrelay/relay/relay"
)

// Byte bounds of the poller's reads (see "Memory" in the package doc).
//
// Every read measures each row in SQL, without loading it: sz is the
// octet_length of key, payload and headers (as JSON text), which reads only
// the length word of a TOASTed value. A row above the message limit comes
// back without its payload and headers (and without its key when the key
// alone is above the limit): the core dead-letters it and copies its
// content on the server. A page stops, in SQL, before the row
// that would take the bytes of the rows loaded so far above the page
// budget, except that the first row loaded always comes (alone, when it is
// larger than the budget).

// limits are the two byte bounds, built into the SQL text as constants.
type limits struct {
	// message: a row larger than this comes without its content.
	message int64
	// page: the most bytes of loaded rows one page returns.
	page int64
}

// rowSize joins each row e to its size z.sz.
const rowSize = `CROSS JOIN LATERAL (SELECT coalesce(octet_length(e.key), 0)::bigint + coalesce(octet_length(e.payload), 0)
    + coalesce(octet_length(e.headers::text), 0) AS sz) AS z`

// pageTSOrder is the commit-timestamp order of a page's rows; txid may be
// text or xid8 there.
const pageTSOrder = `page.ck, page.txid::text::xid8, page.id`

// eventCols are the columns of an event read from e joined to z: its
// content only when it is within the message limit, and its size.
func (l limits) eventCols() string {
	limit := strconv.FormatInt(l.message, 10)
	fits := `CASE WHEN z.sz <= ` + limit + ` THEN `
	// The key of a row too large comes when the key alone is within the
	// limit: the dead-letter policy holds events by key.
	keyFits := `CASE WHEN coalesce(octet_length(e.key), 0) <= ` + limit + ` THEN `
	return `e.id, e.event_id::text AS event_id, e.topic, ` + keyFits + `e.key END AS key, ` + fits + `e.payload END AS payload, ` +
		fits + `e.headers::text END AS headers, e.created_at, z.sz`
}

// cost is what a row of a page (aliased page) counts against the page
// budget: its size when its content is loaded, else nothing. An int4 (a
// loaded row is within the message limit), so that its sum is a bigint,
// not a numeric.
func (l limits) cost() string {
	return `CASE WHEN page.sz <= ` + strconv.FormatInt(l.message, 10) + ` THEN page.sz::int ELSE 0 END`
}

// budget wraps a page query (whose rows come in order) into one that
// returns the rows that fit the page budget, with two more columns: run,
// the cost of the rows up to and including each one, and more, whether a
// row follows it in the page: more on the last row returned means the
// budget cut the page short. One window, which streams.
func (l limits) budget(page, order string) string {
	cost := l.cost()
	return `SELECT * FROM (SELECT page.*, sum(` + cost + `) OVER w AS run, lead(page.id) OVER w IS NOT NULL AS more
    FROM (` + page + `) AS page WINDOW w AS (ORDER BY ` + order + ` ROWS UNBOUNDED PRECEDING)) AS page
WHERE page.run <= ` + strconv.FormatInt(l.page, 10) + ` OR page.run = ` + cost + ` ORDER BY ` + order
}

// sized completes an event read with its size sz: one above the message
// limit was read without its content.
func (l limits) sized(e *relay.Event, sz int64) {
	if sz > l.message {
		e.TooLarge = sz
	}
}

// take returns how many of the next rows, of these sizes, one page
// returns: at least one, and no more than max rows or than fit the budget.
func (l limits) take(sizes []int64, max int) int {
	var sum int64
	for i, sz := range sizes[:min(len(sizes), max)] {
		if sz > l.message {
			sz = 0
		}
		if sum > 0 && sum+sz > l.page {
			return i
		}
		sum += sz
	}
	return min(len(sizes), max)
}
