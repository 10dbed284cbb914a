package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// ack is one published batch waiting for its Postgres acknowledgement.
type ack struct {
	ids     []int64
	dead    []deadLetter
	through Position
	state   []byte
	count   int
	byTopic map[string]int
}

type deadLetter struct {
	event  Event
	reason string
	err    error
}

// pipeline runs source -> sink -> acknowledgement until ctx ends (graceful)
// or something fails. Three goroutines overlap the work: one reads the next
// batch while another publishes the current one, and a third commits the
// acknowledgements of earlier batches, several per transaction when they
// queue up.
func (r *Relay) pipeline(ctx context.Context, lost <-chan error) error {
	// hard ends all work: on failure, on a lost lock, or when a graceful
	// stop overruns ShutdownTimeout.
	hard, cancelHard := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHard()
	fe := &firstErr{cancel: cancelHard}
	go func() {
		select {
		case err := <-lost:
			fe.set(err)
		case <-ctx.Done():
			select {
			case err := <-lost:
				fe.set(err)
			case <-time.After(r.cfg.ShutdownTimeout):
				fe.set(fmt.Errorf("graceful stop took longer than %v", r.cfg.ShutdownTimeout))
			case <-hard.Done():
			}
		case <-hard.Done():
		}
	}()

	ck, err := r.loadCheckpoint(hard)
	if err != nil {
		r.m.Errors.WithLabelValues("ack").Inc()
		return err
	}
	if err := r.sink.Start(hard, ck.state); err != nil {
		r.m.Errors.WithLabelValues("sink").Inc()
		return fmt.Errorf("starting the sink: %w", err)
	}
	defer r.sink.Close(context.WithoutCancel(ctx))
	if err := r.source.Start(hard, ck.position); err != nil {
		r.m.Errors.WithLabelValues("source").Inc()
		return fmt.Errorf("starting the source: %w", err)
	}
	defer r.source.Close(context.WithoutCancel(ctx))
	r.log.Info("pipeline started", "position", ck.position.String())

	// read ends on a graceful stop as well as on hard.
	read, cancelRead := context.WithCancel(hard)
	defer cancelRead()
	go func() {
		select {
		case <-ctx.Done():
		case <-hard.Done():
		}
		cancelRead()
	}()

	go r.sampleBacklog(read)
	batches := make(chan []Event, 2)
	acks := make(chan ack, 8)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		defer close(batches)
		fe.set(r.readLoop(read, batches, ck.position))
	}()
	go func() {
		defer wg.Done()
		defer close(acks)
		fe.set(r.publishLoop(hard, batches, acks, ck.state))
	}()
	go func() {
		defer wg.Done()
		fe.set(r.ackLoop(hard, acks))
	}()
	wg.Wait()
	if fe.err != nil {
		return fe.err
	}
	return nil
}

func (r *Relay) readLoop(ctx context.Context, out chan<- []Event, after Position) error {
	last := after
	for {
		events, err := r.source.Next(ctx, r.cfg.BatchSize)
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
		select {
		case out <- kept:
		case <-ctx.Done():
			return nil
		}
	}
}

func (r *Relay) publishLoop(ctx context.Context, in <-chan []Event, out chan<- ack, state []byte) error {
	for events := range in {
		a := ack{
			ids:     make([]int64, 0, len(events)),
			through: events[len(events)-1].Position,
			state:   state,
			byTopic: map[string]int{},
		}
		msgs := make([]Message, 0, len(events))
		routed := make([]Event, 0, len(events))
		for _, e := range events {
			a.ids = append(a.ids, e.ID)
			msg, err := Route(e, r.cfg.MaxMessageBytes)
			if err != nil {
				var re *RouteError
				errors.As(err, &re)
				a.dead = append(a.dead, deadLetter{event: e, reason: re.Reason, err: err})
				continue
			}
			msgs = append(msgs, msg)
			routed = append(routed, e)
		}
		if len(msgs) > 0 {
			res, err := r.sink.Publish(ctx, msgs)
			if err != nil {
				if ctx.Err() == nil {
					r.m.Errors.WithLabelValues("sink").Inc()
				}
				return fmt.Errorf("publishing: %w", err)
			}
			now := time.Now()
			var worst time.Duration
			for i, e := range routed {
				if ferr, failed := res.Failed[i]; failed {
					a.dead = append(a.dead, deadLetter{event: e, reason: ReasonSinkRejected, err: ferr})
					continue
				}
				a.count++
				a.byTopic[e.Topic]++
				lat := now.Sub(e.CreatedAt)
				r.m.Latency.Observe(lat.Seconds())
				worst = max(worst, lat)
			}
			if worst > r.maxLatency {
				r.maxLatency = worst
				r.m.LatencyMax.Set(worst.Seconds())
			}
			r.m.BatchSize.Observe(float64(len(msgs)))
			if res.State != nil {
				state = res.State
				a.state = state
			}
		}
		select {
		case out <- a:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// ackLoop commits acknowledgements in order, merging those that queue up.
func (r *Relay) ackLoop(ctx context.Context, in <-chan ack) error {
	for a := range in {
		merged := []ack{a}
	more:
		for len(merged) < 16 {
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
		if err := r.commitAcks(ctx, merged); err != nil {
			r.m.Errors.WithLabelValues("ack").Inc()
			return err
		}
		last := merged[len(merged)-1]
		if err := r.source.Acked(ctx, last.through); err != nil {
			r.m.Errors.WithLabelValues("source").Inc()
			return fmt.Errorf("confirming to the source: %w", err)
		}
		for _, m := range merged {
			for topic, n := range m.byTopic {
				r.m.Published.WithLabelValues(topic).Add(float64(n))
			}
		}
		r.m.LastPublished.SetToCurrentTime()
	}
	return nil
}

// commitAcks deletes the published rows, records dead letters and saves the
// checkpoint, all in one transaction.
func (r *Relay) commitAcks(ctx context.Context, acks []ack) error {
	var ids []int64
	var published int
	for _, a := range acks {
		ids = append(ids, a.ids...)
		published += a.count
	}
	last := acks[len(acks)-1]
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(r.deleteSQL, ids)
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
				b.Queue(r.deadSQL, e.ID, e.EventID, e.Topic, key, e.Payload, headers, e.CreatedAt, d.err.Error())
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

// sampleBacklog keeps the backlog gauge current while ctx lasts. It counts
// exactly up to 100,000 rows and uses the planner's estimate beyond that,
// so a large backlog does not cost a full scan every few seconds.
func (r *Relay) sampleBacklog(ctx context.Context) {
	t := time.NewTicker(r.cfg.BacklogInterval)
	defer t.Stop()
	for {
		var n int64
		if err := r.pool.QueryRow(ctx, r.backlogSQL).Scan(&n); err == nil {
			r.m.Backlog.Set(float64(n))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
