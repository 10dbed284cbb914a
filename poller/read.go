package poller

// Reading a batch: the fresh read that takes a tick, the pages after it,
// and the listing of a large batch in commit-timestamp order (the
// statements are relay/store's PollReader).

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/store"
)

// fresh takes a snapshot and reads the first page of its batch, recording
// the tick (and pruning acknowledged ones) in the same statement when the
// batch has rows.
func (p *Poller) fresh(ctx context.Context, max int) ([]relay.Event, error) {
	prune := p.acked.Load()
	if prune <= p.pruned {
		prune = 0
	}
	b := &batch{tick: tick{n: p.nextTick, byTS: p.byTS}, prev: p.prev}
	lim := p.rows.next(max)
	events, snap, cut, err := p.read(b, lim, func(each func(store.PageRow) bool) error {
		return p.q.ReadFresh(ctx, p.conn, b.byTS, b.prev, lim, int64(b.n), int64(prune), each)
	})
	if err != nil {
		return nil, err
	}
	if prune > 0 {
		p.pruned = prune
	}
	if len(events) == 0 {
		return nil, nil
	}
	if snap == nil {
		return nil, errors.New("poller: the tick's snapshot was not returned")
	}
	p.nextTick++
	b.snap = *snap
	b.started = true
	b.done = len(events) < lim && !cut
	p.cur = b
	p.finish()
	return events, nil
}

// page reads the next page of the current batch.
func (p *Poller) page(ctx context.Context, max int) ([]relay.Event, error) {
	// On a copy: a read that fails half way leaves the batch's cursor as it
	// was.
	b := *p.cur
	events, err := p.pageOf(ctx, &b, max)
	if err != nil {
		return nil, err
	}
	*p.cur = b
	return events, nil
}

func (p *Poller) pageOf(ctx context.Context, b *batch, max int) ([]relay.Event, error) {
	if !b.byTS {
		first := !b.started && b.prev != nil
		lim := p.rows.next(max)
		events, _, cut, err := p.read(b, lim, func(each func(store.PageRow) bool) error {
			return p.q.ReadIDPage(ctx, p.conn, first, b.prev, b.snap, b.lastID, lim, each)
		})
		if err != nil {
			return nil, err
		}
		b.started = true
		b.done = len(events) < lim && !cut
		return events, nil
	}
	if !b.started && b.prev != nil {
		lim := p.rows.next(max)
		events, _, cut, err := p.read(b, lim, func(each func(store.PageRow) bool) error {
			return p.q.ReadFirstTSPage(ctx, p.conn, b.prev, b.snap, lim, each)
		})
		if err != nil {
			return nil, err
		}
		b.started = true
		b.done = len(events) < lim && !cut
		return events, nil
	}
	if !b.listed {
		if err := p.list(ctx, b); err != nil {
			return nil, err
		}
	}
	n := p.lim.take(b.sizes, max)
	take := b.ids[:n]
	b.ids, b.sizes = b.ids[n:], b.sizes[n:]
	b.done = len(b.ids) == 0
	return p.fetch(ctx, b, take)
}

// list reads, in commit-timestamp order, the ids of the batch's rows after
// the last one delivered.
func (p *Poller) list(ctx context.Context, b *batch) error {
	lastTxid := b.lastTxid
	if !b.started {
		b.lastKey, lastTxid = minKey, "0"
	}
	ids, sizes, err := p.q.ListTS(ctx, p.conn, b.prev, b.snap, b.lastKey, lastTxid, b.lastID)
	if err != nil {
		return fmt.Errorf("poller: listing a large batch: %w", err)
	}
	b.ids, b.sizes, b.listed, b.started = ids, sizes, true, true
	return nil
}

// fetch reads the rows of ids and returns them in the order of ids. A row
// deleted meanwhile (by someone else) is left out.
func (p *Poller) fetch(ctx context.Context, b *batch, ids []int64) ([]relay.Event, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	byID := make(map[int64]relay.Event, len(ids))
	err := p.q.Fetch(ctx, p.conn, ids, func(r store.PageRow) {
		e := p.eventOf(r)
		byID[e.ID] = e
	})
	if err != nil {
		return nil, fmt.Errorf("poller: reading events: %w", err)
	}
	events := make([]relay.Event, 0, len(byID))
	for _, id := range ids {
		e, ok := byID[id]
		if !ok {
			continue
		}
		b.ordinal++
		e.Position = relay.Position{Major: b.n, Minor: b.ordinal}
		events = append(events, e)
	}
	return events, nil
}

// read runs a page read of b, with row limit lim, and numbers the events
// it keeps: the rows within the page budget (see limits). A fresh read
// returns the tick's snapshot in its first row. cut reports that the page
// budget ended the page before its row limit did.
func (p *Poller) read(b *batch, lim int, run func(each func(store.PageRow) bool) error) (_ []relay.Event, _ *string, cut bool, _ error) {
	// Sized by what arrives, not by max: under a steady load most reads
	// return a few rows, and a max-sized slice each time fed the GC. After
	// a full page (a backlog) the next is likely full too, and growing the
	// slice row by row copied each page's events about twice.
	var events []relay.Event
	if p.rows.full {
		events = make([]relay.Event, 0, lim)
	}
	var snap *string
	var used int64
	// After a cut, the store reads the rest of the page one message at a
	// time without holding it, and the statement's end: a fresh read's
	// tick is recorded only if the whole statement succeeded.
	err := run(func(r store.PageRow) bool {
		// The row that does not fit is dropped: at most one message
		// beyond the budget is held, and only until the next row.
		if !p.lim.fits(len(events), used, p.lim.cost(r.Size)) {
			cut = true
			return false
		}
		used += p.lim.cost(r.Size)
		if b.byTS {
			b.lastKey, b.lastTxid = r.CommitKey, r.Txid
		}
		if r.Snapshot != nil {
			snap = r.Snapshot
		}
		e := p.eventOf(r)
		b.ordinal++
		b.lastID = e.ID
		e.Position = relay.Position{Major: b.n, Minor: b.ordinal}
		events = append(events, e)
		return true
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("poller: reading events: %w", err)
	}
	p.rows.observe(lim, len(events), used, p.lim.page, cut)
	return events, snap, cut, nil
}

// eventOf is the event of a row a page read returned.
func (p *Poller) eventOf(r store.PageRow) relay.Event {
	e := relay.Event{ID: r.ID, EventID: r.EventID, Topic: r.Topic, Payload: r.Payload, CreatedAt: r.CreatedAt}
	p.lim.sized(&e, r.Size)
	if r.Key != nil {
		e.Key = []byte(*r.Key)
	}
	if r.Headers != nil {
		e.Headers = []byte(*r.Headers)
	}
	return e
}
