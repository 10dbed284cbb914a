package relay

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
)

func pageOf(n, topics int) []Event {
	events := make([]Event, n)
	for i := range events {
		events[i].Topic = fmt.Sprintf("t%d", i%topics)
	}
	return events
}

// largePageOf is pageOf with payloads of size bytes.
func largePageOf(n, topics, size int) []Event {
	events := pageOf(n, topics)
	for i := range events {
		events[i].Payload = make([]byte, size)
	}
	return events
}

func TestPageSizer(t *testing.T) {
	p := newPageSizer(100, 1<<20)
	var sizes []int
	for range 5 {
		p.observe(pageOf(p.size(), p.size())) // one event per topic
		sizes = append(sizes, p.size())
	}
	if want := []int{200, 400, 800, 800, 800}; !slices.Equal(sizes, want) {
		t.Errorf("thin full pages grew the limit through %v, want %v", sizes, want)
	}
	p.observe(pageOf(800, 100)) // 8 per topic: kept
	if p.size() != 800 {
		t.Errorf("a full page of 8 events per topic changed the limit to %d, want 800 kept", p.size())
	}
	p.observe(pageOf(800, 25)) // 32 per topic: halved
	if p.size() != 400 {
		t.Errorf("a full page of 32 events per topic left the limit at %d, want 400", p.size())
	}
	p.observe(pageOf(201, 201)) // over half the limit: full
	if p.size() != 800 {
		t.Errorf("a thin page of 201 events for a limit of 400 moved it to %d, want 800", p.size())
	}
	p.observe(largePageOf(50, 50, 12<<10)) // few events, but 600 KiB of 1 MiB: full
	if p.size() != 800 {
		t.Errorf("a thin page cut by its bytes moved the limit to %d, want 800 kept", p.size())
	}
	p.observe(pageOf(399, 399)) // short, however thin: the backlog is drained
	if p.size() != 100 {
		t.Errorf("a short page left the limit at %d, want BatchSize, 100", p.size())
	}
	for range 3 {
		p.observe(pageOf(p.size(), 1))
	}
	if p.size() != 100 {
		t.Errorf("full pages of one topic moved the limit to %d, want BatchSize, 100", p.size())
	}

	big := newPageSizer(50_000, 1<<20)
	for range 3 {
		big.observe(pageOf(big.size(), big.size()))
	}
	if big.size() != maxPage {
		t.Errorf("BatchSize 50000 grew to %d, want the cap %d", big.size(), maxPage)
	}
	one := newPageSizer(1, 1<<20)
	for range 5 {
		one.observe(pageOf(one.size(), one.size()))
	}
	if one.size() != pageGrowth {
		t.Errorf("BatchSize 1 grew to %d, want %d", one.size(), pageGrowth)
	}
}

// TestThinBacklogReadsLargerPages runs the pipeline over real Postgres on
// a backlog spread over many topics, and over one topic: the first reads
// pages growing to pageGrowth x BatchSize, and BatchSize again once the
// backlog is drained; the second stays at BatchSize. Either way every event
// is published once, in order, and the relay reports draining (the longer
// acknowledgement interval) during the backlog and not after it.
func TestThinBacklogReadsLargerPages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		topics int
		grow   bool
	}{
		{"500 topics", 500, true},
		{"one topic", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			url, conn := pgtest.MigratedDatabase(t, "outbox")
			const n, batchSize = 2900, 50 // the last page, 150 events, is short
			events := insertOrders(t, conn, `SELECT 'orders', 'k' || g, convert_to('e' || g, 'UTF8') FROM generate_series(1, $1) AS g`, n)
			for i := range events {
				events[i].Topic = fmt.Sprintf("orders-%d", i%tc.topics)
			}
			src := &tableSource{events: events, chunk: n}
			sink := &flakySink{}
			r, stop, done := runRelay(t, ctx, Config{DatabaseURL: url, BatchSize: batchSize, Lease: time.Second, ReadyTimeout: -1}, src, sink)
			sawDraining := false
			awaitDrained(t, conn, time.Minute, func(map[int64]bool) { sawDraining = sawDraining || r.draining() })
			// Drained, the reader says so at its next, short page, or
			// drainingWindow after its last full one (one topic: the
			// backlog ends at a page's end).
			stopped := testwait.Poll(10*time.Second, func() bool { return !r.draining() })
			if !sawDraining || !stopped {
				t.Errorf("draining seen during the backlog: %v; after it: %v; want true, then false", sawDraining, r.draining())
			}
			if got := r.ackInterval(); got != r.cfg.AckInterval {
				t.Errorf("live acknowledgement interval %v, want AckInterval, %v", got, r.cfg.AckInterval)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			now := time.Now()
			r.fullPage.Store(&now)
			if got := r.ackInterval(); got != drainingAckFactor*r.cfg.AckInterval {
				t.Errorf("acknowledgement interval just after a full page %v, want %d x %v", got, drainingAckFactor, r.cfg.AckInterval)
			}
			before := now.Add(-drainingWindow)
			r.fullPage.Store(&before)
			if got := r.ackInterval(); got != r.cfg.AckInterval {
				t.Errorf("acknowledgement interval %v after the last full page %v, want AckInterval, %v", got, drainingWindow, r.cfg.AckInterval)
			}
			src.mu.Lock()
			asked := slices.Clone(src.asked)
			src.mu.Unlock()
			top := slices.Max(asked)
			switch {
			case tc.grow && top != pageGrowth*batchSize:
				t.Errorf("pages asked for %v: want growth to %d", asked, pageGrowth*batchSize)
			case tc.grow && asked[len(asked)-1] != batchSize:
				t.Errorf("pages asked for %v: want BatchSize, %d, again once drained", asked, batchSize)
			case !tc.grow && top != batchSize:
				t.Errorf("pages of one topic asked for %v: want BatchSize, %d, throughout", asked, batchSize)
			}
			sink.mu.Lock()
			defer sink.mu.Unlock()
			if len(sink.got) != n {
				t.Fatalf("%d events published, want %d once each", len(sink.got), n)
			}
			for i, m := range sink.got {
				if string(m.EventID()) != events[i].EventID {
					t.Fatalf("event %d published at place %d: out of source order", events[i].ID, i)
				}
			}
			t.Logf("pages asked for: %v", asked)
		})
	}
}
