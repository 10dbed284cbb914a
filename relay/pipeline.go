package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"
)

// ack is one published batch waiting for its Postgres acknowledgement.
type ack struct {
	ids []int64
	// published are the ids the sink made durable, in publication order
	// (archived when retention is on).
	published []int64
	dead      []deadLetter
	through   Position
	state     []byte
	count     int
	byTopic   map[string]int
	// replay is set for a chunk of republished archive rows.
	replay *replayChunk
}

// batch is what the read loop hands the publisher: live events from the
// source, or a replay chunk of archived events.
type batch struct {
	events []Event
	replay *replayChunk
}

type deadLetter struct {
	event  Event
	reason string
	err    error
}

// pipeline runs source -> sink -> acknowledgement until ctx ends (graceful)
// or something fails, while l is held: leading ends when the lease is lost.
// Four stages overlap the work: one reads the next batch while another
// hands the current one to the sink, a third waits for the sink to make
// earlier batches durable (a PipelinedSink takes several before the first
// is), and a fourth commits the acknowledgements of durable batches, several
// per transaction when they queue up. They, the backlog sampler and the
// pruner run in one errgroup, and all have returned when pipeline returns.
func (r *Relay) pipeline(ctx, leading context.Context, l *lease) error {
	// hard ends all work: on failure, when the lease is lost, or when a
	// graceful stop overruns ShutdownTimeout.
	hard, cancelHard := context.WithCancelCause(leading)
	defer cancelHard(nil)
	stopOverrun := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.ShutdownTimeout, func() {
			cancelHard(fmt.Errorf("graceful stop took longer than %v", r.cfg.ShutdownTimeout))
		})
		context.AfterFunc(hard, func() { t.Stop() })
	})
	defer stopOverrun()
	err := r.runPipeline(ctx, hard, l)
	if cause := context.Cause(hard); err != nil && cause != nil && hard.Err() != nil && !errors.Is(cause, context.Canceled) {
		// The stages report that their context ended; the cause says why.
		return cause
	}
	return err
}

func (r *Relay) runPipeline(ctx, hard context.Context, l *lease) error {
	ck, err := r.loadCheckpoint(hard)
	if err != nil {
		r.m.Errors.WithLabelValues("ack").Inc()
		return err
	}
	if err := r.sink.Start(hard, Session{State: ck.state, Fence: l.Fence}); err != nil {
		r.m.Errors.WithLabelValues("sink").Inc()
		return fmt.Errorf("starting the sink: %w", err)
	}
	defer r.sink.Close(context.WithoutCancel(ctx))
	if rs, ok := r.source.(Resetter); ok && ck.switched {
		if err := rs.Reset(hard); err != nil {
			r.m.Errors.WithLabelValues("source").Inc()
			return fmt.Errorf("resetting the source after a switch of readers: %w", err)
		}
	}
	if err := r.source.Start(hard, ck.position); err != nil {
		r.m.Errors.WithLabelValues("source").Inc()
		return fmt.Errorf("starting the source: %w", err)
	}
	defer r.source.Close(context.WithoutCancel(ctx))
	r.log.Info("pipeline started", "position", ck.position.String(), "epoch", l.epoch)
	// Running again: readiness now follows the sink (which reports its own
	// failures, a full disk for one) until the pipeline fails again.
	r.lastErr.Store(nil)

	g, work := errgroup.WithContext(hard)
	// read ends on a graceful stop as well as when work does.
	read, cancelRead := context.WithCancel(work)
	defer cancelRead()
	stopRead := context.AfterFunc(ctx, cancelRead)
	defer stopRead()

	g.Go(func() error { r.sampleBacklog(read); return nil })
	if r.cfg.Retain > 0 {
		g.Go(func() error { r.pruneArchive(read); return nil })
	}
	batches := make(chan batch, 2)
	flights := make(chan flight, maxInFlight-1)
	acks := make(chan ack, 8)
	tracker := newAckTracker()
	g.Go(func() error {
		defer close(batches)
		return r.readLoop(read, batches, ck.position, tracker)
	})
	g.Go(func() error {
		defer close(flights)
		return r.publishLoop(work, batches, flights)
	})
	g.Go(func() error {
		defer close(acks)
		return r.durableLoop(work, flights, acks, ck.state)
	})
	g.Go(func() error { return r.ackLoop(work, acks, tracker, l) })
	return g.Wait()
}

type liveBatch struct {
	events []Event
	err    error
}

// readLoop hands the publisher live batches from the source and, between
// them, chunks of running replays (see replay.go for why this order is
// reproducible after a crash).
func (r *Relay) readLoop(ctx context.Context, out chan<- batch, after Position, tracker *ackTracker) error {
	last := after
	rp := &replayer{r: r, tracker: tracker}
	if err := rp.resume(ctx, out, last); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		r.m.Errors.WithLabelValues("replay").Inc()
		return err
	}
	// The source is read ahead by one batch so that a replay can proceed
	// while Next waits for live events.
	fetchCtx, stopFetch := context.WithCancel(ctx)
	live := make(chan liveBatch)
	go func() {
		defer close(live)
		for {
			events, err := r.source.Next(fetchCtx, r.cfg.BatchSize)
			select {
			case live <- liveBatch{events, err}:
			case <-fetchCtx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		stopFetch()
		for range live {
		}
	}()
	nextReplay := time.Now()
	for {
		var lb liveBatch
		if !time.Now().Before(nextReplay) {
			did, err := rp.step(ctx, out, last)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				r.m.Errors.WithLabelValues("replay").Inc()
				return err
			}
			if !did {
				nextReplay = time.Now().Add(r.cfg.ReplayInterval)
				continue
			}
			// Alternate: one live batch, if one is ready, between chunks.
			select {
			case lb = <-live:
			default:
				continue
			}
		} else {
			wait := time.NewTimer(time.Until(nextReplay))
			select {
			case lb = <-live:
				wait.Stop()
			case <-wait.C:
				continue
			case <-ctx.Done():
				wait.Stop()
				return nil
			}
		}
		events, err := lb.events, lb.err
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.m.Errors.WithLabelValues("source").Inc()
			return fmt.Errorf("reading the source: %w", err)
		}
		// A source may deliver events the checkpoint already covers (the
		// WAL reader replays from its slot); they are published already.
		kept := events[:0]
		for _, e := range events {
			if last.Less(e.Position) {
				kept = append(kept, e)
				last = e.Position
			}
		}
		if len(kept) == 0 {
			continue
		}
		tracker.sent.Add(1)
		select {
		case out <- batch{events: kept}:
		case <-ctx.Done():
			return nil
		}
	}
}

// flight is a batch the sink took and may not have made durable yet.
type flight struct {
	a      ack
	routed []Event
	// wait returns the sink's result once the batch is durable; nil when
	// nothing was published (every event went to the dead letters).
	wait func() (PublishResult, error)
}

// maxInFlight is how many batches may be written to a PipelinedSink and
// not yet durable.
const maxInFlight = 4

// publishLoop routes each batch and hands it to the sink; durableLoop
// waits for the sink to make it durable.
func (r *Relay) publishLoop(ctx context.Context, in <-chan batch, out chan<- flight) error {
	for b := range in {
		events := b.events
		f := flight{
			a: ack{
				ids:       make([]int64, 0, len(events)),
				published: make([]int64, 0, len(events)),
				through:   events[len(events)-1].Position,
				byTopic:   map[string]int{},
				replay:    b.replay,
			},
			routed: make([]Event, 0, len(events)),
		}
		var replayHeader Header
		if b.replay != nil {
			f.a.through = b.replay.after
			replayHeader = Header{Key: HeaderReplay, Value: []byte(strconv.FormatInt(b.replay.request, 10))}
		}
		msgs := make([]Message, 0, len(events))
		for _, e := range events {
			msg, err := Route(e, r.cfg.MaxMessageBytes)
			if b.replay != nil {
				// An archived event was published once; one that no
				// longer routes (a lower size limit) is skipped.
				if err != nil {
					r.log.Warn("replay skips an event that no longer routes", "request", b.replay.request, "event_id", e.EventID, "err", err)
					continue
				}
				msg.Headers = append(msg.Headers, replayHeader)
				msgs = append(msgs, msg)
				f.routed = append(f.routed, e)
				continue
			}
			f.a.ids = append(f.a.ids, e.ID)
			if err != nil {
				var re *RouteError
				errors.As(err, &re)
				f.a.dead = append(f.a.dead, deadLetter{event: e, reason: re.Reason, err: err})
				continue
			}
			msgs = append(msgs, msg)
			f.routed = append(f.routed, e)
		}
		if len(msgs) > 0 {
			wait, err := r.startPublish(ctx, msgs)
			if err != nil {
				if ctx.Err() == nil {
					r.m.Errors.WithLabelValues("sink").Inc()
				}
				return fmt.Errorf("publishing: %w", err)
			}
			f.wait = wait
			r.m.BatchSize.Observe(float64(len(msgs)))
		}
		select {
		case out <- f:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// startPublish hands msgs to the sink: without waiting for durability when
// the sink can pipeline, else with Publish.
func (r *Relay) startPublish(ctx context.Context, msgs []Message) (func() (PublishResult, error), error) {
	if ps, ok := r.sink.(PipelinedSink); ok {
		return ps.PublishAsync(ctx, msgs)
	}
	res, err := r.sink.Publish(ctx, msgs)
	if err != nil {
		return nil, err
	}
	return func() (PublishResult, error) { return res, nil }, nil
}

// durableLoop waits, in order, for each batch in flight to be durable,
// completes its acknowledgement and passes it on.
func (r *Relay) durableLoop(ctx context.Context, in <-chan flight, out chan<- ack, state []byte) error {
	for f := range in {
		a := f.a
		if f.wait != nil {
			res, err := f.wait()
			if err != nil {
				if ctx.Err() == nil {
					r.m.Errors.WithLabelValues("sink").Inc()
				}
				return fmt.Errorf("publishing: %w", err)
			}
			r.settle(&a, f.routed, res)
			if res.State != nil {
				state = res.State
			}
		}
		a.state = state
		select {
		case out <- a:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// settle records in a the sink's verdict on each published event, and the
// latency of those now durable.
func (r *Relay) settle(a *ack, routed []Event, res PublishResult) {
	now := time.Now()
	var worst, worstCommit time.Duration
	for i, e := range routed {
		if a.replay != nil {
			if ferr, failed := res.Failed[i]; failed {
				r.log.Warn("replay skips an event the sink refuses", "request", a.replay.request, "event_id", e.EventID, "err", ferr)
			} else {
				a.replay.sent++
			}
			continue
		}
		if ferr, failed := res.Failed[i]; failed {
			a.dead = append(a.dead, deadLetter{event: e, reason: ReasonSinkRejected, err: ferr})
			continue
		}
		a.count++
		a.published = append(a.published, e.ID)
		a.byTopic[e.Topic]++
		lat := now.Sub(e.CreatedAt)
		r.m.Latency.Observe(lat.Seconds())
		worst = max(worst, lat)
		if !e.CommittedAt.IsZero() {
			lat := now.Sub(e.CommittedAt)
			r.m.CommitLatency.Observe(lat.Seconds())
			worstCommit = max(worstCommit, lat)
		}
	}
	if worst > r.maxLatency {
		r.maxLatency = worst
		r.m.LatencyMax.Set(worst.Seconds())
	}
	if worstCommit > r.maxCommitLatency {
		r.maxCommitLatency = worstCommit
		r.m.CommitMax.Set(worstCommit.Seconds())
	}
}

// maxMerge is the most batches one acknowledgement transaction covers.
const maxMerge = 64

// ackLoop commits acknowledgements in order, merging those that arrive
// within AckInterval of the previous commit.
func (r *Relay) ackLoop(ctx context.Context, in <-chan ack, tracker *ackTracker, l *lease) error {
	var lastCommit time.Time
	for a := range in {
		merged := []ack{a}
		if wait := time.Until(lastCommit.Add(r.cfg.AckInterval)); wait > 0 {
			timer := time.NewTimer(wait)
		collect:
			for len(merged) < maxMerge {
				select {
				case next, ok := <-in:
					if !ok {
						break collect
					}
					merged = append(merged, next)
				case <-timer.C:
					break collect
				}
			}
			timer.Stop()
		}
	more:
		for len(merged) < maxMerge {
			select {
			case next, ok := <-in:
				if !ok {
					break more
				}
				merged = append(merged, next)
			default:
				break more
			}
		}
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
		if err := r.removeRows(ctx, tx, ids, archived); err != nil {
			return err
		}
		b := &pgx.Batch{}
		for _, a := range acks {
			if a.replay != nil {
				b.Queue(r.replay.ack, a.replay.request, a.replay.through, a.replay.sent)
			}
		}
		for _, a := range acks {
			for _, d := range a.dead {
				e := d.event
				var headers *string
				if e.Headers != nil {
					h := string(e.Headers)
					headers = &h
				}
				var key *string
				if e.Key != nil {
					k := string(e.Key)
					key = &k
				}
				b.Queue(r.deadSQL, e.ID, e.EventID, e.Topic, key, e.Payload, headers, e.CreatedAt, d.err.Error(), d.reason)
			}
		}
		b.Queue(r.checkpointSQL, r.cfg.Name, int64(last.through.Major), int64(last.through.Minor), last.state, published, r.cfg.SourceKind)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("acknowledging %d events: %w", len(ids), err)
	}
	for _, a := range acks {
		for _, d := range a.dead {
			r.m.DeadLetters.WithLabelValues(d.reason).Inc()
			r.log.Warn("event moved to the dead letters", "event_id", d.event.EventID, "id", d.event.ID,
				"topic", d.event.Topic, "reason", d.reason, "err", d.err)
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
		tag, err := tx.Exec(ctx, r.deleteRangesSQL, runs.lo, runs.hi)
		if err != nil {
			return 0, err
		}
		n += tag.RowsAffected()
	}
	if len(runs.singles) > 0 {
		tag, err := tx.Exec(ctx, r.deleteSQL, runs.singles)
		if err != nil {
			return 0, err
		}
		n += tag.RowsAffected()
	}
	return n, nil
}

// archiveRows moves the acknowledged rows to the archive, retrying those
// not visible yet as removeRows does.
func (r *Relay) archiveRows(ctx context.Context, tx pgx.Tx, ids, archived []int64) error {
	pending := ids
	return r.untilRemoved(ctx, func() (int, []any, error) {
		rows, err := tx.Query(ctx, r.replay.archive, pending, keepOrder(archived, pending))
		if err != nil {
			return 0, nil, err
		}
		removed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
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

// sampleBacklog keeps the backlog gauge current while ctx lasts. It counts
// exactly up to 100,000 rows and uses the planner's estimate beyond that,
// so a large backlog does not cost a full scan every few seconds.
func (r *Relay) sampleBacklog(ctx context.Context) {
	t := time.NewTicker(r.cfg.BacklogInterval)
	defer t.Stop()
	var rate float64
	lastCount, lastAt := r.published.Load(), time.Now()
	// Each sample weighs so that the rate reflects about the last minute.
	weight := min(1, r.cfg.BacklogInterval.Seconds()/60)
	for {
		var n int64
		if err := r.pool.QueryRow(ctx, r.backlogSQL).Scan(&n); err == nil {
			r.m.Backlog.Set(float64(n))
			count, now := r.published.Load(), time.Now()
			if dt := now.Sub(lastAt).Seconds(); dt > 0 && count >= lastCount {
				sample := float64(count-lastCount) / dt
				if rate == 0 {
					rate = sample
				} else {
					rate += weight * (sample - rate)
				}
			}
			lastCount, lastAt = count, now
			r.m.PublishRate.Set(rate)
			r.m.DrainETA.Set(drainETA(n, rate))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drainETA is the seconds a backlog of n rows takes at rate events/s: 0
// when empty, -1 when nothing is being published.
func drainETA(n int64, rate float64) float64 {
	switch {
	case n == 0:
		return 0
	case rate < 0.001:
		return -1
	}
	return float64(n) / rate
}
