package relay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// flight is a batch the sink took and may not have made durable yet.
type flight struct {
	a      ack
	routed []Event
	// bytes is what the batch holds of the pipeline's byte budget.
	bytes int64
	// wait returns the sink's result once the batch is durable; nil when
	// nothing was published (every event went to the dead letters).
	wait func() (PublishResult, error)
	// msgs and sent are the messages handed to the sink and when: kept
	// only while tracing (trace.go).
	msgs []Message
	sent time.Time
}

// maxInFlight is how many batches may be written to a PipelinedSink and
// not yet durable.
const maxInFlight = 4

// publishLoop routes each batch and hands it to the sink; durableLoop
// waits for the sink to make it durable. A batch the destination refuses
// for now waits (publishWaiting); stop, the graceful stop, ends that
// wait and the loop.
func (r *Relay) publishLoop(ctx, stop context.Context, in <-chan batch, out chan<- flight) error {
	for b := range in {
		if v := r.cfg.Validator; v != nil {
			if err := v.Refresh(ctx); err != nil {
				r.m.Errors.WithLabelValues("schema").Inc()
				return fmt.Errorf("reading the schema contracts: %w", err)
			}
		}
		if b.release != nil {
			f, msgs := r.routeRelease(b)
			if stopped, err := r.hand(ctx, stop, f, msgs, out); err != nil || stopped {
				return err
			}
			continue
		}
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
			bytes:  b.bytes,
		}
		var replayHeader Header
		if b.replay != nil {
			f.a.through = b.replay.after
			replayHeader = Header{Key: HeaderReplay, Value: []byte(strconv.FormatInt(b.replay.request, 10))}
		}
		msgs := make([]Message, 0, len(events))
		routes := r.routeAll(events)
		for i, e := range events {
			msg, err := routes[i].msg, routes[i].err
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
			if e.HasRow() {
				f.a.ids = append(f.a.ids, e.ID)
			}
			if r.heartbeatIn(&f.a, e) {
				continue
			}
			if held, ok := r.heldOf(e); ok {
				f.a.dead = append(f.a.dead, held)
				continue
			}
			if err != nil {
				var re *RouteError
				errors.As(err, &re)
				f.a.dead = append(f.a.dead, r.deadLetterOf(e, re.Reason, err))
				continue
			}
			msgs = append(msgs, msg)
			f.routed = append(f.routed, e)
		}
		if stopped, err := r.hand(ctx, stop, f, msgs, out); err != nil || stopped {
			return err
		}
	}
	return nil
}

// hand gives a batch's messages to the sink and its flight to the
// durability stage; stopped reports a graceful stop while the destination
// refused the batch.
func (r *Relay) hand(ctx, stop context.Context, f flight, msgs []Message, out chan<- flight) (stopped bool, err error) {
	if len(msgs) > 0 {
		var start time.Time
		if r.cfg.Tracer != nil {
			start = time.Now()
		}
		wait, err := r.publishWaiting(ctx, stop, msgs)
		if err == nil && wait == nil {
			return true, nil
		}
		if err != nil {
			if ctx.Err() == nil {
				r.m.Errors.WithLabelValues("sink").Inc()
			}
			return false, fmt.Errorf("publishing: %w", err)
		}
		f.wait = wait
		r.m.BatchSize.Observe(float64(len(msgs)))
		if r.cfg.Tracer != nil {
			f.msgs, f.sent = msgs, start
		}
	}
	select {
	case out <- f:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return false, nil
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
func (r *Relay) durableLoop(ctx context.Context, in <-chan flight, out chan<- ack, state []byte, budget *byteBudget) error {
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
			var traced []trace.SpanContext
			if r.cfg.Tracer != nil {
				traced = r.traceBatch(f, res)
			}
			r.settle(&a, f.routed, res, traced)
			if res.State != nil {
				state = res.State
			}
		}
		budget.release(f.bytes)
		a.state = state
		r.probeSink(ctx, &a)
		select {
		case out <- a:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// settle records in a the sink's verdict on each published event, and the
// latency of those now durable; traced, when tracing, has each event's
// span context for the dwell histogram's exemplars.
func (r *Relay) settle(a *ack, routed []Event, res PublishResult, traced []trace.SpanContext) {
	if a.release != nil {
		r.settleRelease(a, routed, res)
		return
	}
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
			a.dead = append(a.dead, r.deadLetterOf(e, ReasonSinkRejected, ferr))
			continue
		}
		a.count++
		if e.HasRow() {
			a.published = append(a.published, e.ID)
		}
		a.byTopic[e.Topic]++
		lat := now.Sub(e.CreatedAt)
		r.m.Latency.Observe(lat.Seconds())
		worst = max(worst, lat)
		dwell := lat
		if !e.CommittedAt.IsZero() {
			lat := now.Sub(e.CommittedAt)
			r.m.CommitLatency.Observe(lat.Seconds())
			worstCommit = max(worstCommit, lat)
			dwell = lat
		}
		var sc trace.SpanContext
		if traced != nil {
			sc = traced[i]
		}
		r.observeDwell(e.Topic, dwell, sc)
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
