package relay

// Retention and replay.
//
// With Config.Retain > 0 the acknowledgement moves published rows into
// <schema>.events_archive in publication order (its seq), and a pruner
// deletes rows published longer ago than Retain.
//
// A replay request (<schema>.replay_requests, written by `relay replay`) is
// executed by the leader inside its read loop, between live batches, as
// chunks of archived events that go through the same publish and ack path
// as live batches. Each republished event carries its original
// relay-event-id and a relay-replay header naming the request, so its
// identity differs from its first publication's: after a crash or a
// takeover the embedded sink skips exactly the chunk events its log
// already holds, whatever order they come back in. The acknowledgement of
// a chunk, in the same fenced transaction as the live checkpoint, advances
// the request's cursor, so a deposed leader can never mark a replay done.
//
// The read loop still keeps the interleaving simple, so that a request's
// progress is one cursor:
//
//  1. Before a chunk, the read loop waits until every batch it sent is
//     acknowledged: nothing live is in flight.
//  2. It then records the chunk's extent (inflight_through) on the request,
//     in its own transaction, and hands the chunk to the publisher.
//  3. The chunk's acknowledgement advances the request's cursor and clears
//     inflight_through.
//  4. After a crash, a request with inflight_through set is republished
//     from its cursor to inflight_through before any live batch (the sink
//     skips what it holds). The pruner never deletes rows above the cursor
//     of a running or in-flight request, and the archive only grows above
//     a request's bound, so the rows of a chunk are the same when
//     republished.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// replayChunk is a batch of archived events being republished.
type replayChunk struct {
	request int64
	// through is the archive seq the acknowledgement moves the cursor to.
	through int64
	// after is the live position already sent, which the acknowledgement
	// saves again as the checkpoint.
	after Position
	// sent counts the messages the sink accepted, filled by the publisher.
	sent int
}

// ackTracker lets the read loop wait until every batch it sent is
// acknowledged.
type ackTracker struct {
	sent, acked atomic.Int64
	wake        chan struct{}
}

func newAckTracker() *ackTracker { return &ackTracker{wake: make(chan struct{}, 1)} }

func (t *ackTracker) ackedBatches(n int) {
	t.acked.Add(int64(n))
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *ackTracker) waitIdle(ctx context.Context) error {
	for t.acked.Load() < t.sent.Load() {
		select {
		case <-t.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// replayer is the read loop's replay state.
type replayer struct {
	r       *Relay
	tracker *ackTracker
	// lease fences the transactions that start a request or record a
	// chunk, as the acknowledgements are fenced.
	lease *lease
	// budget bounds the bytes of the chunks in flight with the live
	// batches'.
	budget *byteBudget
	// chunkSent is set while a chunk this session sent may be
	// unacknowledged.
	chunkSent bool
}

// resume republishes the chunk a previous leader handed to the sink without
// seeing its acknowledgement, if any. It runs before any live batch.
func (p *replayer) resume(ctx context.Context, out chan<- batch, after Position) error {
	inflight, found, err := p.r.store.ReplayInFlight(ctx, p.r.pool)
	if err != nil {
		return fmt.Errorf("looking for an unacknowledged replay chunk: %w", err)
	}
	if !found {
		return nil
	}
	id, cursor, through := inflight.Request, inflight.Cursor, inflight.Through
	var f ReplayFilter
	if err := json.Unmarshal([]byte(inflight.Filter), &f); err != nil {
		return fmt.Errorf("replay request %d: %w", id, err)
	}
	events, err := p.r.archivedEvents(ctx, p.r.pool, cursor, through, f, 1<<31-1)
	if err != nil {
		return err
	}
	p.r.log.Info("republishing the replay chunk in flight at the last stop", "request", id, "after_seq", cursor, "through_seq", through, "events", len(events))
	return p.send(ctx, out, batch{events: events, replay: &replayChunk{request: id, through: through, after: after}})
}

func (p *replayer) send(ctx context.Context, out chan<- batch, b batch) error {
	if len(b.events) == 0 {
		// Nothing to publish: the acknowledgement alone moves the cursor,
		// fenced like every acknowledgement.
		return pgx.BeginFunc(ctx, p.r.pool, func(tx pgx.Tx) error {
			if err := p.r.fence(ctx, tx, p.lease); err != nil {
				return err
			}
			return p.r.store.ReplayAck(ctx, tx, b.replay.request, b.replay.through, 0)
		})
	}
	p.tracker.sent.Add(1)
	p.chunkSent = true
	if !sendBatch(ctx, out, b, p.budget) {
		return ctx.Err()
	}
	return nil
}

// step hands the next chunk of the oldest unfinished replay request to the
// publisher. It reports false when there is no replay work.
func (p *replayer) step(ctx context.Context, out chan<- batch, after Position) (bool, error) {
	r := p.r
	if p.chunkSent {
		// The request's last chunk must be acknowledged before the next
		// one is taken.
		if err := p.tracker.waitIdle(ctx); err != nil {
			return false, err
		}
		p.chunkSent = false
	}
	// Step 1: nothing live may be in flight when a chunk is recorded.
	id, ok, err := r.pickWork(ctx, r.store.PickReplay, "replay requests", p.tracker)
	if !ok {
		return false, err
	}
	var chunk *batch
	err = pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		chunk = nil
		if err := r.fence(ctx, tx, p.lease); err != nil {
			return err
		}
		q, err := r.store.LockReplay(ctx, tx, id)
		if err != nil {
			return err
		}
		filter, status, cursor, bound := q.Filter, q.Status, q.Cursor, q.Bound
		if q.InflightThrough != nil || (status != ReplayPending && status != ReplayRunning) {
			return nil // cancelled meanwhile
		}
		var f ReplayFilter
		if err := json.Unmarshal([]byte(filter), &f); err != nil {
			return r.store.FailReplay(ctx, tx, id, "unreadable filter: "+err.Error())
		}
		if status == ReplayPending {
			if err := f.Validate(); err != nil {
				return r.store.FailReplay(ctx, tx, id, err.Error())
			}
			start, ok, err := replayStart(ctx, r.store, tx, f)
			if err != nil {
				return err
			}
			if !ok {
				return r.store.FailReplay(ctx, tx, id, fmt.Sprintf("event %s is not in the archive", f.FromEvent))
			}
			top, err := r.store.ArchiveTop(ctx, tx)
			if err != nil {
				return err
			}
			total, err := r.store.CountArchived(ctx, tx, start, top, archiveFilterOf(f))
			if err != nil {
				return err
			}
			if err := r.store.StartReplay(ctx, tx, id, start, top, total); err != nil {
				return err
			}
			r.log.Info("replay started", "request", id, "events", total, "filter", filter)
			cursor, bound = start, &top
		}
		events, err := r.archivedEvents(ctx, tx, cursor, *bound, f, r.cfg.BatchSize)
		if err != nil {
			return err
		}
		through := *bound
		if len(events) == r.cfg.BatchSize {
			through = int64(events[len(events)-1].Position.Major)
		}
		// Step 2: the chunk's extent is recorded before the sink sees it.
		if len(events) > 0 {
			if err := r.store.MarkReplayInFlight(ctx, tx, id, through); err != nil {
				return err
			}
		}
		chunk = &batch{events: events, replay: &replayChunk{request: id, through: through, after: after}}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("replay request %d: %w", id, err)
	}
	if chunk == nil {
		return true, nil
	}
	if err := p.send(ctx, out, *chunk); err != nil {
		return false, err
	}
	return true, nil
}

// archivedEvents reads up to limit archived events in (after, through]
// matching f, in publication order. Each event's Position.Major is its
// archive seq.
func (r *Relay) archivedEvents(ctx context.Context, db DB, after, through int64, f ReplayFilter, limit int) ([]Event, error) {
	stored, err := r.store.ReplayChunk(ctx, db, after, through, archiveFilterOf(f), limit)
	if err != nil {
		return nil, fmt.Errorf("reading archived events: %w", err)
	}
	out := make([]Event, 0, len(stored))
	for _, s := range stored {
		e := eventOf(s)
		e.Position = Position{Major: uint64(s.ID)}
		out = append(out, e)
	}
	return out, nil
}

// archivePruner returns the pruner service's pass: it deletes up to
// PruneBatch archived events older than the retention, and asks for the
// next pass at once when it deleted a full batch (every PruneInterval
// otherwise, maintenance.go).
func (r *Relay) archivePruner() func(context.Context) (bool, error) {
	interval := strconv.FormatInt(r.cfg.Retain.Microseconds(), 10) + " microseconds"
	return func(ctx context.Context) (bool, error) {
		pruned, err := r.store.PruneArchive(ctx, r.pool, interval, r.cfg.PruneBatch)
		if err != nil {
			return false, err
		}
		r.m.ArchivePruned.Add(float64(pruned))
		return pruned == int64(r.cfg.PruneBatch), nil
	}
}
