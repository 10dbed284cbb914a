package relay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

// maxMerge is the most batches one acknowledgement transaction covers.
const maxMerge = 64

// mergeMore appends to merged the acknowledgements that arrive on in, up
// to maxMerge in all, until in is closed or deadline fires; with a nil
// deadline it takes only those already waiting.
func mergeMore(in <-chan ack, merged []ack, deadline <-chan time.Time) []ack {
	for len(merged) < maxMerge {
		var next ack
		var ok bool
		if deadline == nil {
			select {
			case next, ok = <-in:
			default:
				return merged
			}
		} else {
			select {
			case next, ok = <-in:
			case <-deadline:
				return merged
			}
		}
		if !ok {
			return merged
		}
		merged = append(merged, next)
	}
	return merged
}

// drainingAckFactor is how many times AckInterval acknowledgements wait
// while a backlog is read. Each acknowledgement is a Postgres transaction
// (a DELETE, the checkpoint's UPDATE, a WAL flush) on the machine that
// also serves the reader: a CDC backlog of 1,000,000 events drained at
// 0.90-0.91 of pg_recvlogical's rate with 10ms and 0.92-0.96 with 100ms,
// at 10 % less relay CPU. Live, the interval stays short, so rows leave
// the outbox soon after they are published.
const drainingAckFactor = 10

// drainingWindow is how long after a full page the relay counts as
// draining a backlog: a backlog that ends exactly at a page's end leaves
// no short page until the next event arrives, and a slow sink makes the
// reader wait between full pages.
const drainingWindow = time.Second

// draining reports whether the reader read a full page within
// drainingWindow (on the monotonic clock) and no short page since.
func (r *Relay) draining() bool {
	at := r.fullPage.Load()
	return at != nil && time.Since(*at) < drainingWindow
}

// ackInterval is the shortest time between two acknowledgement
// transactions: AckInterval, or drainingAckFactor times it while a backlog
// is read.
func (r *Relay) ackInterval() time.Duration {
	if r.draining() {
		return drainingAckFactor * r.cfg.AckInterval
	}
	return r.cfg.AckInterval
}

// ackLoop commits acknowledgements in order, merging those that arrive
// within ackInterval of the previous commit.
func (r *Relay) ackLoop(ctx context.Context, in <-chan ack, tracker *ackTracker, l *lease) error {
	var lastCommit time.Time
	for a := range in {
		merged := []ack{a}
		if wait := time.Until(lastCommit.Add(r.ackInterval())); wait > 0 {
			timer := time.NewTimer(wait)
			merged = mergeMore(in, merged, timer.C)
			timer.Stop()
		}
		merged = mergeMore(in, merged, nil)
		if err := r.commitAcks(ctx, merged, l); err != nil {
			r.m.Errors.WithLabelValues("ack").Inc()
			return err
		}
		lastCommit = time.Now()
		tracker.ackedBatches(len(merged))
		last := merged[len(merged)-1]
		if !last.through.IsZero() {
			if err := r.source.Acked(ctx, last.through); err != nil {
				r.m.Errors.WithLabelValues("source").Inc()
				return fmt.Errorf("confirming to the source: %w", err)
			}
		}
		for _, m := range merged {
			for topic, n := range m.byTopic {
				r.m.Published.WithLabelValues(topic).Add(float64(n))
			}
			r.published.Add(int64(m.count))
			if m.replay != nil {
				r.m.Replayed.Add(float64(m.replay.sent))
			}
			if m.heartbeat != 0 {
				r.beats.reached(m.heartbeat)
			}
		}
		r.m.LastPublished.SetToCurrentTime()
	}
	return nil
}

// commitAcks deletes (or archives) the published rows, records dead
// letters, advances replay cursors and saves the checkpoint, all in one
// transaction.
func (r *Relay) commitAcks(ctx context.Context, acks []ack, l *lease) error {
	var ids, archived []int64
	var published int
	for _, a := range acks {
		ids = append(ids, a.ids...)
		archived = append(archived, a.published...)
		published += a.count
	}
	last := acks[len(acks)-1]
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if err := r.fence(ctx, tx, l); err != nil {
			return err
		}
		if err := r.deadLetterRows(ctx, tx, acks); err != nil {
			return err
		}
		if err := r.removeRows(ctx, tx, ids, archived); err != nil {
			return err
		}
		b := &pgx.Batch{}
		for _, a := range acks {
			if a.replay != nil {
				r.store.QueueReplayAck(b, a.replay.request, a.replay.through, a.replay.sent)
			}
		}
		for _, a := range acks {
			for _, d := range a.dead {
				e := d.event
				if e.TooLarge > 0 {
					continue // copied by deadLetterRows
				}
				row := d.row()
				row.Key, row.Payload, row.Headers = textOrNil(e.Key), e.Payload, textOrNil(e.Headers)
				r.store.QueueDeadLetter(b, row)
			}
			if a.release != nil {
				r.queueRelease(b, a.release)
			}
		}
		r.store.QueueCheckpoint(b, r.cfg.Name, store.Checkpoint{Major: int64(last.through.Major), Minor: int64(last.through.Minor),
			State: last.state, Source: r.cfg.SourceKind}, published)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("acknowledging %d events: %w", len(ids), err)
	}
	for _, a := range acks {
		for _, d := range a.dead {
			if d.heldBy != 0 {
				r.log.Debug("event held behind its key's dead letter", "event_id", d.event.EventID, "id", d.event.ID, "held_by", d.heldBy)
				continue
			}
			r.m.DeadLetters.WithLabelValues(d.reason).Inc()
			r.log.Warn("event moved to the dead letters", "event_id", d.event.EventID, "id", d.event.ID,
				"topic", d.event.Topic, "reason", d.reason, "holds_key", d.holds, "err", d.err)
		}
		if a.release != nil {
			r.releaseAcked(a.release)
		}
	}
	return nil
}

// removeRows deletes (or archives) the acknowledged rows. The WAL reader
// can deliver a transaction before the transaction is visible to other
// sessions: PostgreSQL streams the commit record before it marks the
// transaction committed in shared memory. A row not found yet is looked for
// again in a fresh snapshot (each statement of a READ COMMITTED transaction
// takes one) after a short wait, so that no published row stays in the
// outbox, where a later read of the table would publish it again. Rows
// still missing after about 130 ms were deleted by someone else.
func (r *Relay) removeRows(ctx context.Context, tx pgx.Tx, ids, archived []int64) error {
	if r.cfg.Retain > 0 {
		return r.archiveRows(ctx, tx, ids, archived)
	}
	runs := idRunsOf(ids)
	var removed int64
	return r.untilRemoved(ctx, func() (int, []any, error) {
		n, err := r.deleteRuns(ctx, tx, runs)
		removed += n
		return runs.count - int(removed), nil, err
	})
}

// untilRemoved calls try, which removes what it can of the acknowledged
// rows and says how many are still missing, until none is, waiting
// removeWait between attempts. After maxRemoveAttempts retries (about
// 130 ms, not a visibility delay: those last microseconds) the rows were
// deleted by someone else; that is logged, with what try described.
func (r *Relay) untilRemoved(ctx context.Context, try func() (missing int, detail []any, err error)) error {
	for attempt := 0; ; attempt++ {
		missing, detail, err := try()
		if err != nil || missing <= 0 {
			return err
		}
		if attempt == maxRemoveAttempts {
			r.log.Warn("acknowledged rows were not in the outbox (deleted by someone else?)", append([]any{"rows", missing}, detail...)...)
			return nil
		}
		if err := sleepCtx(ctx, removeWait(attempt)); err != nil {
			return err
		}
	}
}

// maxRemoveAttempts retries, with removeWait between them, last about
// 130 ms.
const maxRemoveAttempts = 7

func removeWait(attempt int) time.Duration {
	return min(time.Millisecond<<attempt, 100*time.Millisecond)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// idRuns is a set of row ids as runs of consecutive ids, deleted by range
// (an index range scan, about half the cost of looking each id up), and
// the ids outside runs.
type idRuns struct {
	lo, hi  []int64
	singles []int64
	count   int
}

// minRun is the shortest run of consecutive ids deleted as a range.
const minRun = 4

func idRunsOf(ids []int64) idRuns {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	runs := idRuns{count: len(sorted)}
	for i := 0; i < len(sorted); {
		j := i + 1
		for j < len(sorted) && sorted[j] == sorted[j-1]+1 {
			j++
		}
		if j-i >= minRun {
			runs.lo = append(runs.lo, sorted[i])
			runs.hi = append(runs.hi, sorted[j-1])
		} else {
			runs.singles = append(runs.singles, sorted[i:j]...)
		}
		i = j
	}
	return runs
}

// deleteRuns deletes the rows of runs, returning how many it found. Every
// id inside a run was published, so a range deletes nothing else.
func (r *Relay) deleteRuns(ctx context.Context, tx pgx.Tx, runs idRuns) (int64, error) {
	var n int64
	if len(runs.lo) > 0 {
		d, err := r.store.DeleteRanges(ctx, tx, runs.lo, runs.hi)
		if err != nil {
			return 0, err
		}
		n += d
	}
	if len(runs.singles) > 0 {
		d, err := r.store.DeleteIDs(ctx, tx, runs.singles)
		if err != nil {
			return 0, err
		}
		n += d
	}
	return n, nil
}

// archiveRows moves the acknowledged rows to the archive, retrying those
// not visible yet as removeRows does.
func (r *Relay) archiveRows(ctx context.Context, tx pgx.Tx, ids, archived []int64) error {
	pending := ids
	return r.untilRemoved(ctx, func() (int, []any, error) {
		removed, err := r.store.ArchiveRows(ctx, tx, pending, keepOrder(archived, pending))
		if err != nil {
			return 0, nil, err
		}
		gone := make(map[int64]bool, len(removed))
		for _, id := range removed {
			gone[id] = true
		}
		var rest []int64
		for _, id := range pending {
			if !gone[id] {
				rest = append(rest, id)
			}
		}
		pending = rest
		return len(pending), []any{"ids", pending[:min(len(pending), 10)]}, nil
	})
}

// keepOrder returns the elements of ordered that are in subset, in
// ordered's order.
func keepOrder(ordered, subset []int64) []int64 {
	in := make(map[int64]bool, len(subset))
	for _, id := range subset {
		in[id] = true
	}
	var out []int64
	for _, id := range ordered {
		if in[id] {
			out = append(out, id)
		}
	}
	return out
}

// textOrNil is b as a text argument: NULL when b is nil.
func textOrNil(b []byte) *string {
	if b == nil {
		return nil
	}
	t := string(b)
	return &t
}
