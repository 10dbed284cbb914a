package poller

import (
	"github.com/outboxrelay/relay/relay"
)

// Byte bounds of the poller's reads (see "Memory" in the package doc).
//
// Every read measures each row in SQL, without loading it: sz is the
// octet_length of key, payload and headers (as JSON text), which reads only
// the length word of a TOASTed value. A row above the message limit comes
// back without its payload and headers (and without its key when the key
// alone is above the limit): the core dead-letters it and copies its
// content on the server. A page keeps, as the rows arrive, the rows up to
// the one that would take the bytes of the rows loaded so far above the
// page budget, except that the first row loaded always comes (alone, when
// it is larger than the budget); the rest of the page is read and dropped
// one row at a time, never held (see rowLimit for how few are sent).
// A running sum in SQL (a window) did the same on the server, but cost
// more than the rest of the read: 3.4 ms against 1.8 ms for a 1,000-row
// page of 200-byte rows.

// limits are the two byte bounds; the message limit is built into the
// statements' text (relay/store.NewPollReader).
type limits struct {
	// message: a row larger than this comes without its content.
	message int64
	// page: the most bytes of loaded rows one page returns.
	page int64
}

// cost is what a loaded row of size sz counts against the page budget:
// its size when its content is loaded, else nothing.
func (l limits) cost(sz int64) int64 {
	if sz > l.message {
		return 0
	}
	return sz
}

// fits reports whether a row costing cost still belongs to a page whose
// rows so far cost used (n of them): the first row always does.
func (l limits) fits(n int, used, cost int64) bool {
	return n == 0 || used+cost <= l.page
}

// rowLimit is the row limit of the poller's next page read: the caller's
// max, or fewer while the rows are large. The byte budget is enforced as
// the rows arrive (read keeps the rows that fit and discards the rest of
// the page without holding it), so this only bounds the work of rows sent
// and discarded: after a page the budget cut at n rows the next asks for n,
// and each page that used at most half the budget doubles the limit back
// towards max.
type rowLimit struct {
	// rows is the current limit; 0 means max.
	rows int
	// full says the last page kept as many rows as its limit: a backlog,
	// whose next page is read into a slice of the limit's size rather
	// than one grown (and copied) as the rows arrive.
	full bool
}

// next returns the row limit of the next page read.
func (r *rowLimit) next(max int) int {
	if r.rows <= 0 || r.rows >= max {
		return max
	}
	return r.rows
}

// observe adapts the limit to a page read with limit lim that kept n rows
// costing used bytes of a budget of page, cut short by the budget or not.
func (r *rowLimit) observe(lim, n int, used, page int64, cut bool) {
	r.full = n == lim
	switch {
	case cut:
		r.rows = max(1, n)
	case n == lim && used <= page/2:
		r.rows = 2 * lim
	}
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
