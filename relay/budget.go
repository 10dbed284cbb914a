package relay

import (
	"context"

	"golang.org/x/sync/semaphore"
)

// A pipeline's memory is bounded by bytes as well as by rows. The read
// loop splits what the source returns into batches of at most BatchBytes
// (a single larger event makes a batch alone) and takes each batch's bytes
// from a budget of maxInFlight batches before handing it on; the durable
// loop gives them back once the sink made the batch durable and dropped
// it. Between the source and durability the relay therefore holds at most
// the budget, plus the batch waiting for it and the page the source reads
// meanwhile: (maxInFlight+2) x BatchBytes of events, and the sink's encoded
// copies of the batches in flight. A batch larger than the whole budget (one
// event above it) waits until nothing else is in flight.

// byteBudget is the bytes of events the pipeline may hold between reading
// and durability.
type byteBudget struct {
	sem      *semaphore.Weighted
	capacity int64
}

func newByteBudget(batchBytes int) *byteBudget {
	capacity := int64(batchBytes) * maxInFlight
	return &byteBudget{sem: semaphore.NewWeighted(capacity), capacity: capacity}
}

// acquire takes n bytes (at most the whole budget) and returns what it
// took, to hand to release.
func (b *byteBudget) acquire(ctx context.Context, n int64) (int64, error) {
	n = min(n, b.capacity)
	if err := b.sem.Acquire(ctx, n); err != nil {
		return 0, err
	}
	return n, nil
}

func (b *byteBudget) release(n int64) {
	if n > 0 {
		b.sem.Release(n)
	}
}

// eventBytes is what an event counts against the budget: its variable
// parts.
func eventBytes(e Event) int64 {
	return int64(len(e.Key) + len(e.Payload) + len(e.Headers) + len(e.Topic) + len(e.EventID))
}

// splitBytes cuts events into consecutive runs of at most max bytes each;
// an event larger than max is a run alone.
func splitBytes(events []Event, max int64) [][]Event {
	var runs [][]Event
	start, sum := 0, int64(0)
	for i, e := range events {
		n := eventBytes(e)
		if i > start && sum+n > max {
			runs = append(runs, events[start:i])
			start, sum = i, 0
		}
		sum += n
	}
	return append(runs, events[start:])
}

// eventsBytes is what events count against the budget together.
func eventsBytes(events []Event) int64 {
	var n int64
	for _, e := range events {
		n += eventBytes(e)
	}
	return n
}

// sendBatch takes b's bytes from the budget and hands b to the publisher.
// It returns false when ctx ended first.
func sendBatch(ctx context.Context, out chan<- batch, b batch, budget *byteBudget) bool {
	held, err := budget.acquire(ctx, eventsBytes(b.events))
	if err != nil {
		return false
	}
	b.bytes = held
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		budget.release(held)
		return false
	}
}
