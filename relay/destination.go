package relay

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Why the destination refuses a topic's events for now; also the "reason"
// label of relay_destination_waiting_since_timestamp_seconds.
const (
	// WaitTopicMissing: the topic does not exist and the sink may not
	// create it.
	WaitTopicMissing = "topic_missing"
	// WaitUnauthorized: the relay's principal may not write (or describe)
	// the topic.
	WaitUnauthorized = "unauthorized"
	// WaitThrottled: the cluster throttles the relay (a quota on topic
	// creation).
	WaitThrottled = "throttled"
	// WaitCreateRefused: the cluster's policy refuses to create the topic
	// as the relay asks.
	WaitCreateRefused = "create_refused"
)

// DestinationError is a sink's refusal of a batch for a fact about the
// destination, not about any of its events: a topic that does not exist
// (yet), a missing authorization, a throttled topic creation. Such events
// are not dead-lettered: the core keeps the batch, and everything behind
// it, in the outbox and offers the same batch again every
// destinationRetry, until the sink takes it. Meanwhile /readyz fails
// naming the topic, relay_destination_waiting_since_timestamp_seconds
// has a sample per topic, and one log line per destinationLogEvery says
// so.
//
// A sink returns it (alone, or several joined with errors.Join, each
// naming its topic) from Publish or PublishAsync only when it stays
// started and usable, and when a later Publish of the same messages
// publishes each of them once, in order: it wrote nothing of the batch,
// or it remembers what of it is durable already and does not write that
// again.
type DestinationError struct {
	Topic  string
	Reason string
	Err    error
}

func (e *DestinationError) Error() string { return e.Err.Error() }
func (e *DestinationError) Unwrap() error { return e.Err }

// DestinationErrors returns every DestinationError in err's tree; nil
// when err is not made only of them (any other error is the pipeline's
// to handle, with a restart).
func DestinationErrors(err error) []*DestinationError {
	switch e := err.(type) {
	case nil:
		return nil
	case *DestinationError:
		return []*DestinationError{e}
	case interface{ Unwrap() []error }:
		var out []*DestinationError
		for _, x := range e.Unwrap() {
			des := DestinationErrors(x)
			if des == nil {
				return nil
			}
			out = append(out, des...)
		}
		return out
	case interface{ Unwrap() error }:
		return DestinationErrors(e.Unwrap())
	}
	return nil
}

const (
	// destinationRetry is how often a refused batch is offered again: a
	// sink's check is one metadata request (Kafka) or a map lookup
	// (embedded), cheap enough to notice a new topic within a second.
	destinationRetry = time.Second
	// destinationLogEvery spaces the log lines of a long wait.
	destinationLogEvery = 30 * time.Second
)

// waiting is what the destination refuses now, for readiness, the metric
// and `relay status`.
type waiting struct {
	mu     sync.Mutex
	topics map[string]waitingTopic
}

type waitingTopic struct {
	reason string
	since  time.Time
	err    error
}

// err is nil unless events wait for the destination; then it names every
// topic and why.
func (w *waiting) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.topics) == 0 {
		return nil
	}
	names := make([]string, 0, len(w.topics))
	for t := range w.topics {
		names = append(names, t)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, t := range names {
		wt := w.topics[t]
		parts[i] = fmt.Sprintf("topic %s (%s, for %s): %v", t, wt.reason, time.Since(wt.since).Round(time.Second), wt.err)
	}
	return fmt.Errorf("events wait in the outbox for the destination: %s", strings.Join(parts, "; "))
}

// publishWaiting hands msgs to the sink like startPublish, and while the
// sink refuses them with DestinationErrors, offers them again every
// destinationRetry until it takes them, ctx ends (an error), or stop ends
// (a graceful stop: nil wait and nil error, the batch stays in the
// outbox).
func (r *Relay) publishWaiting(ctx, stop context.Context, msgs []Message) (func() (PublishResult, error), error) {
	var lastLog time.Time
	for {
		wait, err := r.startPublish(ctx, msgs)
		des := DestinationErrors(err)
		if des == nil || ctx.Err() != nil {
			r.waitingFor(nil, err == nil)
			return wait, err
		}
		if r.waitingFor(des, false) || time.Since(lastLog) >= destinationLogEvery {
			lastLog = time.Now()
			r.log.Warn("events wait in the outbox: the destination refuses their topic; offering them again until it takes them",
				"err", r.waiting.err(), "events", len(msgs), "retry_every", destinationRetry)
		}
		t := time.NewTimer(destinationRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			r.waitingFor(nil, false)
			return nil, ctx.Err()
		case <-stop.Done():
			t.Stop()
			r.waitingFor(nil, false)
			return nil, nil
		}
	}
}

// waitingFor records that the destination refuses exactly the topics of
// des now (none: it took the batch, when taken, or the wait ended), and
// reports whether a topic is newly refused.
func (r *Relay) waitingFor(des []*DestinationError, taken bool) (changed bool) {
	now := time.Now()
	w := &r.waiting
	w.mu.Lock()
	defer w.mu.Unlock()
	refused := map[string]bool{}
	for _, de := range des {
		refused[de.Topic] = true
		old, ok := w.topics[de.Topic]
		if ok && old.reason == de.Reason {
			old.err = de.Err
			w.topics[de.Topic] = old
			continue
		}
		if ok {
			r.m.DestinationWaiting.DeleteLabelValues(de.Topic, old.reason)
		}
		if w.topics == nil {
			w.topics = map[string]waitingTopic{}
		}
		w.topics[de.Topic] = waitingTopic{reason: de.Reason, since: now, err: de.Err}
		r.m.DestinationWaiting.WithLabelValues(de.Topic, de.Reason).Set(float64(now.UnixNano()) / 1e9)
		changed = true
	}
	for t, wt := range w.topics {
		if refused[t] {
			continue
		}
		delete(w.topics, t)
		r.m.DestinationWaiting.DeleteLabelValues(t, wt.reason)
		if taken {
			r.log.Info("the destination takes the topic again; its waiting events are published in order",
				"topic", t, "reason", wt.reason, "waited", now.Sub(wt.since).Round(time.Millisecond))
		}
	}
	return changed
}
