package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/relay/relay/store"
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
	// release is set for a batch of a held key's release (release.go).
	release *releaseChunk
	// heartbeat is the newest of this process's heartbeats in the batch
	// (heartbeat.go).
	heartbeat uint64
}

// batch is what the read loop hands the publisher: live events from the
// source, or a replay chunk of archived events.
type batch struct {
	events  []Event
	replay  *replayChunk
	release *releaseChunk
	// bytes is what the batch holds of the pipeline's byte budget.
	bytes int64
}

type deadLetter struct {
	event  Event
	reason string
	err    error
	// holds: the dead letter holds its key; heldBy: the event is held
	// behind the dead letter of that outbox row (hold.go).
	holds  bool
	heldBy int64
}

// row is the dead letter as the acknowledgement records it, without the
// event's key, payload and headers (the caller adds them, or the store
// copies them from the outbox row).
func (d deadLetter) row() store.DeadLetterRow {
	e := d.event
	row := store.DeadLetterRow{Row: e.ID, EventID: e.EventID, Topic: e.Topic, CreatedAt: e.CreatedAt,
		Error: d.err.Error(), Reason: d.reason, Holds: d.holds}
	if d.heldBy != 0 {
		row.HeldBy = &d.heldBy
	}
	return row
}

// pipeline runs source -> sink -> acknowledgement until ctx ends (graceful)
// or something fails, while l is held: leading ends when the lease is lost.
// Four stages overlap the work: one reads the next batch while another
// hands the current one to the sink, a third waits for the sink to make
// earlier batches durable (a PipelinedSink takes several before the first
// is), and a fourth commits the acknowledgements of durable batches, several
// per transaction when they queue up. They run in one errgroup; the
// maintenance services (maintenance.go) run beside them; all have returned
// when pipeline returns.
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
	if err := r.loadHolds(hard); err != nil {
		r.m.Errors.WithLabelValues("ack").Inc()
		return err
	}
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
	// The source reads its first page while the sink starts: after a
	// restart the first read of a backlog is mostly the database's work
	// (0.3-0.4 s for 200,000 rows waiting, on one core), and the
	// embedded sink's start is the broker opening its partitions (0.2 s
	// at 8,000 of them, on the other). Nothing is handed to the sink
	// before its Start returned: the page waits in first.
	first := r.prefetch(hard)
	if err := r.sink.Start(hard, Session{State: ck.state, Fence: l.Fence, Placements: r.cfg.Tracer != nil}); err != nil {
		first.cancel()
		r.m.Errors.WithLabelValues("sink").Inc()
		return fmt.Errorf("starting the sink: %w", err)
	}
	defer r.sink.Close(context.WithoutCancel(ctx))
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

	stopServices, err := r.startServices(read)
	if err != nil {
		return err
	}
	defer stopServices()
	batches := make(chan batch, 2)
	// Batches handed to the sink and not yet durable: the one the durable
	// loop waits for, those queued here, and the one the publish loop
	// holds while it waits to queue it; maxInFlight in all
	// (TestPipelineStages counts them).
	flights := make(chan flight, maxInFlight-2)
	acks := make(chan ack, 8)
	tracker := newAckTracker()
	budget := newByteBudget(r.cfg.BatchBytes)
	g.Go(func() error {
		defer close(batches)
		return r.readLoop(read, batches, ck.position, tracker, l, budget, first)
	})
	g.Go(func() error {
		defer close(flights)
		return r.publishLoop(work, ctx, batches, flights)
	})
	g.Go(func() error {
		defer close(acks)
		return r.durableLoop(work, flights, acks, ck.state, budget)
	})
	g.Go(func() error { return r.ackLoop(work, acks, tracker, l) })
	return g.Wait()
}

type liveBatch struct {
	events []Event
	err    error
}

// prefetched is the source's first page, read ahead while the sink
// starts (runPipeline), and the page sizer that sized it, which sizes the
// reads after it.
type prefetched struct {
	done   chan liveBatch // holds the page once read
	cancel context.CancelFunc
	page   *pageSizer
}

// prefetch reads the source's first page in the background.
func (r *Relay) prefetch(ctx context.Context) *prefetched {
	ctx, cancel := context.WithCancel(ctx)
	page := newPageSizer(r.cfg.BatchSize, r.cfg.BatchBytes)
	f := &prefetched{done: make(chan liveBatch, 1), page: page}
	stopped := make(chan struct{})
	f.cancel = func() {
		cancel()
		<-stopped
	}
	go func() {
		defer close(stopped)
		events, err := r.source.Next(ctx, page.size())
		f.done <- liveBatch{events, err}
	}()
	return f
}

// wait returns the prefetched page once read; ok is false when ctx ended
// first.
func (f *prefetched) wait(ctx context.Context) (liveBatch, bool) {
	select {
	case lb := <-f.done:
		return lb, true
	case <-ctx.Done():
		return liveBatch{}, false
	}
}

// stepEnds says whether the read loop ends after a release or replay step
// that returned err, and with what: nil once ctx is cancelled, err (counted
// under stage) when the step failed.
func (r *Relay) stepEnds(ctx context.Context, stage string, err error) (bool, error) {
	if ctx.Err() != nil {
		return true, nil
	}
	if err != nil {
		r.m.Errors.WithLabelValues(stage).Inc()
		return true, err
	}
	return false, nil
}

// pickWork reads the id of the next held key to release or replay request
// with pick and, when there is one, waits until nothing live is in
// flight. ok is false when there is none or on error.
func (r *Relay) pickWork(ctx context.Context, pick func(context.Context, store.DB) (int64, bool, error), what string, tracker *ackTracker) (id int64, ok bool, err error) {
	id, ok, err = pick(ctx, r.pool)
	if err != nil {
		return 0, false, fmt.Errorf("looking for %s: %w", what, err)
	}
	if !ok {
		return 0, false, nil
	}
	if err := tracker.waitIdle(ctx); err != nil {
		return 0, false, err
	}
	return id, true, nil
}

// readLoop hands the publisher live batches from the source and, between
// them, chunks of running replays (see replayer.go).
func (r *Relay) readLoop(ctx context.Context, out chan<- batch, after Position, tracker *ackTracker, l *lease, budget *byteBudget, first *prefetched) error {
	defer first.cancel()
	last := after
	rp := &replayer{r: r, tracker: tracker, lease: l, budget: budget}
	rl := &releaser{r: r, tracker: tracker}
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
		defer r.fullPage.Store(nil)
		lb, ok := first.wait(fetchCtx)
		if !ok {
			return
		}
		page := first.page
		for events, err := lb.events, lb.err; ; events, err = r.source.Next(fetchCtx, page.size()) {
			now := time.Now()
			for _, e := range events {
				r.m.ReadLatency.Observe(now.Sub(e.CreatedAt).Seconds())
			}
			if page.observe(events) {
				r.fullPage.Store(&now)
			} else {
				r.fullPage.Store(nil)
			}
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
			released, err := rl.step(ctx, out, last)
			if stop, err := r.stepEnds(ctx, "release", err); stop {
				return err
			}
			if released {
				continue
			}
			did, err := rp.step(ctx, out, last)
			if stop, err := r.stepEnds(ctx, "replay", err); stop {
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
		for _, events := range splitBytes(kept, int64(r.cfg.BatchBytes)) {
			tracker.sent.Add(1)
			if !sendBatch(ctx, out, batch{events: events}, budget) {
				return nil
			}
		}
	}
}
