package cdc

// The queue between the stream and the core: events pushed in chunks,
// one per transaction, taken by Next and acknowledged, and the flush
// position following the acknowledgements.

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxrelay/relay/relay"
)

// pushLocked queues e in the chunk of its transaction.
func (s *Source) pushLocked(e relay.Event) {
	if s.open == nil || s.open.major != e.Position.Major {
		// Transactions tend to be alike: start at the size of the last
		// one rather than grow from nothing, copying events each time.
		s.open = &chunk{major: e.Position.Major, events: make([]relay.Event, 0, max(s.chunkHint, 1))}
		s.queue = append(s.queue, s.open)
	}
	s.open.events = append(s.open.events, e)
	s.queued++
	s.queuedBytes += eventBytes(e)
	// A transaction still arriving can be taken only in pieces of Next's
	// max, or when the queue is full; waking Next for every event would
	// cost a wake-up per event. The commit wakes it for the rest.
	if len(s.open.events)%wakeEvery == 0 || s.fullLocked() {
		s.notifyLocked()
	}
}

// closeOpenLocked marks the chunk of the transaction being received as
// whole.
func (s *Source) closeOpenLocked() {
	s.chunkHint = min(len(s.open.events), maxChunkHint)
	s.open.closed = true
	s.open = nil
}

// maxChunkHint caps the room a transaction's chunk starts with.
const maxChunkHint = 4096

// wakeEvery is how many events of a transaction still arriving are queued
// between two wake-ups of a waiting Next.
const wakeEvery = 128

// waitForRoom blocks while the queue is full, still sending status
// updates so the server keeps the connection.
func (r *reader) waitForRoom(ctx context.Context, st *statusSender) error {
	s := r.s
	for {
		s.mu.Lock()
		full := s.fullLocked()
		var err error
		if full {
			err = s.waitLockedFor(ctx, s.cfg.StatusInterval)
		}
		s.mu.Unlock()
		if !full || err != nil {
			return err
		}
		if err := st.send(ctx, s, false); err != nil {
			return err
		}
	}
}

// Next returns up to max events in commit order, waiting until there is
// at least one. Whole transactions are returned together when they fit;
// a transaction larger than max is returned in pieces of max events.
func (s *Source) Next(ctx context.Context, max int) ([]relay.Event, error) {
	if max <= 0 {
		return nil, fmt.Errorf("cdc: Next with max %d", max)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return nil, errors.New("cdc: Next before Start")
	}
	for {
		if s.fatal != nil {
			return nil, s.fatal
		}
		if events := s.take(max); len(events) > 0 {
			s.delivered = events[len(events)-1].Position
			s.notifyLocked()
			return events, nil
		}
		if err := s.waitLocked(ctx); err != nil {
			return nil, err
		}
	}
}

// take removes up to max events from the queue: whole closed transactions
// while they fit, else the first part of the first transaction when it
// alone has max events or the queue is full.
func (s *Source) take(max int) []relay.Event {
	var out []relay.Event
	for len(s.queue) > 0 {
		c := s.queue[0]
		if c.closed && len(c.events) <= max-len(out) {
			// The chunk leaves the queue, so its slice can be handed out
			// rather than copied.
			if len(out) == 0 {
				out = c.events
			} else {
				out = append(out, c.events...)
			}
			s.queue[0] = nil
			s.queue = s.queue[1:]
			continue
		}
		if len(out) > 0 {
			break
		}
		if !c.closed && len(c.events) < max && !s.fullLocked() {
			break
		}
		// out is empty here: hand out the head of the chunk, capped so
		// that an append to it cannot reach the events left queued.
		n := min(len(c.events), max)
		out = c.events[:n:n]
		c.events = c.events[n:]
		break
	}
	s.queued -= len(out)
	for _, e := range out {
		s.queuedBytes -= eventBytes(e)
	}
	return out
}

// fullLocked reports whether the queue holds QueueSize events or
// QueueBytes bytes.
func (s *Source) fullLocked() bool {
	return s.queued >= s.cfg.QueueSize || s.queuedBytes >= int64(s.cfg.QueueBytes)
}

// eventBytes is what a queued event counts against QueueBytes.
func eventBytes(e relay.Event) int64 { return int64(len(e.Key) + len(e.Payload) + len(e.Headers)) }

// Acked records that every event up to through is durably published, so
// the flush position sent to the server may move past their
// transactions.
func (s *Source) Acked(ctx context.Context, through relay.Position) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acked.Less(through) {
		s.acked = through
		s.notifyLocked()
	}
	s.advanceLocked()
	return nil
}

// advanceLocked moves flush past every wholly acknowledged transaction,
// and to the server's position when nothing at all is pending.
func (s *Source) advanceLocked() {
	before := s.flush
	for len(s.txs) > 0 {
		t := s.txs[0]
		if !t.empty && s.acked.Less(relay.Position{Major: t.major, Minor: t.last}) {
			break
		}
		s.flush = max(s.flush, t.end)
		s.txs = s.txs[1:]
		if t.marker {
			select {
			case s.markerDone <- t.end:
			default:
			}
		}
	}
	if len(s.txs) == 0 && !s.inTx && s.streamsOpen == 0 && s.open == nil && s.queued == 0 {
		s.flush = max(s.flush, s.serverEnd)
	}
	if s.flush != before {
		s.notifyLocked()
	}
}
