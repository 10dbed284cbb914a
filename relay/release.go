package relay

// Releasing a held key (see hold.go for the policy and its fault model).
//
// `relay dead-letters retry` or `discard` of a dead letter that holds its
// key only resolves the row (holds stays set); the leader does the rest in
// its read loop, between live batches, as replays are done:
//
//  1. It waits until every batch it sent is acknowledged, and sends no live
//     batch until the release is over, so no event of the key is in flight
//     and the held rows are all there is.
//  2. It publishes, through the ordinary publish and acknowledgement path,
//     the retried event (its row as fixed by the operator, with its
//     original event id; not for a discard), then the held events, in
//     their order, a batch at a time, each batch acknowledged before the
//     next is read. The acknowledgement, fenced like every other, records
//     republished_at on the retried dead letter, marks the batch's held
//     rows released and, with the last, clears holds: the key flows again.
//  3. An event of the release that still cannot be published stops it
//     there: a retried event that fails again goes back to unresolved, with
//     its new error, and keeps holding the key; a held event that fails
//     becomes the key's holding dead letter and the rest are held behind
//     it.
//
// SIGKILL or a takeover in the middle: the rows not yet marked released
// are unresolved and holds is still set, so the key is still held (loaded
// at the next start) and the next leader resumes the release from the first
// unreleased row. The batch whose acknowledgement was lost is published
// again; the embedded sink skips what its log holds by event id.

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// releaseChunk is a batch of a release: the retried event and held events
// of one key, read from the dead-letter table.
type releaseChunk struct {
	// holderID and holderRow are the holding dead letter's id and its
	// event's outbox row id (what held rows name in held_by).
	holderID, holderRow int64
	// retry: the chunk starts with the retried event itself.
	retry bool
	// ids are the dead-letter ids of the chunk's events, in order.
	ids []int64
	// after is the live position already sent, saved again as the
	// checkpoint.
	after Position
	// Filled by the publisher: the ids published, and the first event that
	// failed (the retried one failing again, or a new holder).
	published   []int64
	retryFailed *deadLetter
	newHolder   *releaseFailure
}

type releaseFailure struct {
	index   int
	id, row int64
	reason  string
	err     error
}

// releaser runs releases from the read loop.
type releaser struct {
	r       *Relay
	tracker *ackTracker
}

// step releases one retried or discarded holding dead letter, if there is
// one, and reports whether there was.
func (rl *releaser) step(ctx context.Context, out chan<- batch, after Position) (bool, error) {
	r := rl.r
	id, ok, err := r.pickWork(ctx, r.store.PickRelease, "held keys to release", rl.tracker)
	if !ok {
		return false, err
	}
	for {
		h, err := r.store.ReadHolder(ctx, r.pool, id)
		if err != nil {
			return false, fmt.Errorf("reading dead letter %d to release its key: %w", id, err)
		}
		dlID, ev, resolution := h.Event.ID, eventOf(h.Event), h.Resolution
		k := holdKey{ev.Topic, string(ev.Key)}
		if !h.Holds || resolution == "" {
			// Released, or stopped by an event that failed again: the
			// key's holder is whatever the table now says.
			row, err := r.store.KeyHolder(ctx, r.pool, k.topic, k.key)
			if err != nil {
				return false, fmt.Errorf("reading the holder of key %q: %w", k.key, err)
			}
			r.holds.set(k, row)
			if row == 0 {
				r.log.Info("held key released", "topic", k.topic, "key", k.key, "dead_letter", dlID, "resolution", resolution)
			}
			return true, nil
		}
		c := &releaseChunk{holderID: dlID, holderRow: ev.ID, after: after}
		var events []Event
		if resolution == DeadLetterRetried && h.Fresh {
			c.retry = true
			c.ids = append(c.ids, dlID)
			events = append(events, ev)
		}
		held, err := r.store.HeldEvents(ctx, r.pool, ev.ID, r.cfg.BatchSize-len(events))
		if err != nil {
			return false, fmt.Errorf("reading the events held behind dead letter %d: %w", dlID, err)
		}
		for _, he := range held {
			c.ids = append(c.ids, he.ID)
			events = append(events, eventOf(he))
		}
		rl.tracker.sent.Add(1)
		select {
		case out <- batch{events: events, release: c}:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		if err := rl.tracker.waitIdle(ctx); err != nil {
			return false, err
		}
	}
}

// routeRelease routes a release chunk up to its first event that cannot be
// published; the events after that one stay held.
func (r *Relay) routeRelease(b batch) (flight, []Message) {
	c := b.release
	f := flight{a: ack{through: c.after, byTopic: map[string]int{}, release: c}}
	var msgs []Message
	for i, e := range b.events {
		msg, err := r.route(e)
		if err != nil {
			var re *RouteError
			errors.As(err, &re)
			c.failed(i, e, re.Reason, err)
			break
		}
		msgs = append(msgs, msg)
		f.routed = append(f.routed, e)
	}
	return f, msgs
}

// failed records that the chunk's i-th event cannot be published. The
// earliest failure decides; the retried event failing leaves every held
// event behind it.
func (c *releaseChunk) failed(i int, e Event, reason string, err error) {
	if c.retryFailed != nil || (c.newHolder != nil && c.newHolder.index < i) {
		return
	}
	if i == 0 && c.retry {
		c.retryFailed, c.newHolder = &deadLetter{event: e, reason: reason, err: err}, nil
		return
	}
	c.newHolder = &releaseFailure{index: i, id: c.ids[i], row: e.ID, reason: reason, err: err}
}

// settleRelease records the sink's verdict on a release chunk. An event
// the sink refuses stops the release as a routing failure does; events of
// the chunk after it were published already (the limit hold.go states).
func (r *Relay) settleRelease(a *ack, routed []Event, res PublishResult) {
	c := a.release
	for i, e := range routed {
		if ferr, failed := res.Failed[i]; failed {
			c.failed(i, e, ReasonSinkRejected, ferr)
			continue
		}
		c.published = append(c.published, c.ids[i])
		a.count++
		a.byTopic[e.Topic]++
	}
}

// queueRelease adds a release chunk's acknowledgement to the ack
// transaction.
func (r *Relay) queueRelease(b *pgx.Batch, c *releaseChunk) {
	s := r.store
	released := c.published
	if c.retry && len(released) > 0 && released[0] == c.holderID {
		s.QueueRepublished(b, c.holderID)
		released = released[1:]
	}
	if c.retryFailed != nil {
		s.QueueRetryFailed(b, c.holderID, c.retryFailed.reason, c.retryFailed.err.Error())
	}
	if len(released) > 0 {
		s.QueueReleased(b, slices.Clone(released))
	}
	if h := c.newHolder; h != nil {
		s.QueueNewHolder(b, h.id, h.reason, h.err.Error())
		s.QueueMoveHeld(b, c.holderRow, h.row, h.id)
	}
	s.QueueReleaseDone(b, c.holderID, c.holderRow)
}

// releaseAcked logs what an acknowledged release chunk did.
func (r *Relay) releaseAcked(c *releaseChunk) {
	if d := c.retryFailed; d != nil {
		r.m.DeadLetters.WithLabelValues(d.reason).Inc()
		r.log.Warn("a retried dead letter still cannot be published; its key stays held", "dead_letter", c.holderID,
			"event_id", d.event.EventID, "reason", d.reason, "err", d.err)
	}
	if h := c.newHolder; h != nil {
		r.m.DeadLetters.WithLabelValues(h.reason).Inc()
		r.log.Warn("a held event cannot be published; it now holds its key", "dead_letter", h.id, "row", h.row,
			"reason", h.reason, "err", h.err)
	}
}
