package relay

// Pages of a backlog spread thin over many topics grow.
//
// The sink splits a batch by partition, and a record batch costs it about
// the same whether it holds one record or a hundred: a producer-state
// check, a batch header and CRC, a journal record, a segment write. A
// page of BatchSize events spread over as many topics as events becomes
// about as many one-record batches, and the relay's CPU per event grows
// several times (with 1,000 topics of 8 partitions, 2.5-3 s for 200,000
// events against 0.9 s for one topic). The read loop therefore asks the
// source for larger pages while full pages come back thin, for smaller
// ones (down to BatchSize) while they come back thick, and for BatchSize
// again once a page comes back short (the backlog is drained and reads
// are live). Pages stay bounded by the source's page bytes (PageBytes,
// 8 MiB by default) and batches by BatchBytes, so a larger page holds
// more small events, not more memory. Whether pages come back full also
// tells the acknowledgement loop that a backlog is being read (ack.go).

const (
	// pageGrowth is how many times BatchSize a page grows to at most.
	pageGrowth = 8
	// thinPage is the fewest events per topic of a full page that does
	// not grow the next one; thickPage the most that does not shrink it.
	thinPage, thickPage = 8, 32
	// maxPage bounds a grown page, as Config.validate bounds BatchSize.
	maxPage = 100_000
)

// pageSizer picks how many events the read loop asks the source for.
type pageSizer struct {
	base, max, cur int
	// bytes is the batch byte bound, which is also the poll reader's
	// page byte bound.
	bytes int64
}

func newPageSizer(batchSize, batchBytes int) *pageSizer {
	return &pageSizer{base: batchSize, max: max(batchSize, min(pageGrowth*batchSize, maxPage)), cur: batchSize, bytes: int64(batchBytes)}
}

// size is the next page's limit.
func (p *pageSizer) size() int { return p.cur }

// observe adjusts the limit after a page and reports whether the page was
// full, that is, whether a backlog is being read. A page counts as full
// from half its limit in events or half the byte bound on: the WAL reader
// returns whole transactions that fit, and the poll reader ends a page at
// its bytes, so a backlog's pages are not always at the limit. A page
// short of both puts the limit back to BatchSize (the backlog is
// drained). A full one doubles it when its events average fewer than
// thinPage per topic, and halves it when they average thickPage or more.
func (p *pageSizer) observe(events []Event) (full bool) {
	if 2*len(events) < p.cur && 2*eventsBytes(events) < p.bytes {
		p.cur = p.base
		return false
	}
	topics := make(map[string]struct{}, min(len(events)/thinPage+1, 1024))
	for _, e := range events {
		topics[e.Topic] = struct{}{}
	}
	switch per := len(events) / max(len(topics), 1); {
	case per < thinPage:
		p.cur = min(2*p.cur, p.max)
	case per >= thickPage:
		p.cur = max(p.cur/2, p.base)
	}
	return true
}
