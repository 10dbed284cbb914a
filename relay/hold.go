package relay

// The dead-letter policy: what happens to a key's later events when one of
// its events goes to the dead letters.
//
//   - skip (the default): they are published; the key's order has a gap.
//   - hold-key: they are held. The dead letter holds its key (holds in
//     <schema>.dead_letters, migration 009) and each later event of the
//     key is moved, in stream order, into the dead-letter table as a held
//     row (reason "held", held_by naming the holding dead letter's outbox
//     row), in the acknowledgement transaction of its batch, so that other
//     keys flow on. Retrying or discarding the holding dead letter releases
//     the key (release.go): the leader publishes the retried event and then
//     the held ones in their order, and only then the key's new events.
//
// Events without a key have no order to keep and are never held. The
// policy decides when an event fails; a hold, once recorded, lasts until it
// is released, whatever policy a later run has.
//
// # Fault model
//
// The held keys are in Postgres, never only in memory: a hold is the
// dead-letter row, committed in the acknowledgement transaction that
// removes the failed event from the outbox, and a held event's row is
// committed in the transaction that removes it from the outbox. The map in
// memory (holds) is loaded from those rows at every start of the pipeline
// and then kept by the publisher, which is the only stage that decides.
//
//   - SIGKILL at any instruction, a lost connection, a restart of the
//     pipeline or a leader change: an acknowledgement either committed (the
//     hold or the held row is recorded, the event gone from the outbox) or
//     did not (the event is still in the outbox and comes again after the
//     checkpoint, to be decided again against the holds loaded from
//     Postgres, which then include every earlier committed hold). So a key
//     held before the crash is held after it, and an event of a held key is
//     never published before the hold is released. A batch the sink made
//     durable but whose acknowledgement did not commit holds no event of a
//     held key: the publisher left them out.
//   - A deposed leader: its acknowledgements are fenced by the epoch in the
//     same transaction (leadership.go), so it records neither holds nor
//     releases after its lease.
//   - Operator edits: deleting a holding row releases nothing: the held rows
//     that name it stay held and are no longer released by anything, which
//     `relay dead-letters list` shows; setting holds = false by hand lets
//     the key's new events flow ahead of its held ones.
//   - Limit: an event the sink refuses (reason sink_rejected) is known only
//     once its batch came back from the sink; the key's events in the same
//     batch or in batches already handed to the sink are published. The key
//     is held from the next batch on.
//
// Tested with SIGKILLs of the binary while writers commit and a poison event
// sits in the middle of a key's stream (internal/faults TestHoldKeyKills).

import (
	"context"
	"fmt"
	"strings"
	"sync"
)

// Dead-letter policies.
const (
	PolicySkip    = "skip"
	PolicyHoldKey = "hold-key"
)

// ReasonHeld is the reason of a held row: an event kept back behind its
// key's dead letter.
const ReasonHeld = "held"

// ValidPolicy checks a dead-letter policy's name.
func ValidPolicy(p string) error {
	if p != PolicySkip && p != PolicyHoldKey {
		return fmt.Errorf("dead-letter policy %q: must be %s or %s", p, PolicySkip, PolicyHoldKey)
	}
	return nil
}

// ParseTopicPolicies parses per-topic policies, each "topic=policy".
func ParseTopicPolicies(specs []string) (map[string]string, error) {
	out := make(map[string]string, len(specs))
	for _, s := range specs {
		topic, policy, ok := strings.Cut(s, "=")
		if !ok || topic == "" {
			return nil, fmt.Errorf("dead-letter policy %q: want topic=policy", s)
		}
		if err := ValidPolicy(policy); err != nil {
			return nil, fmt.Errorf("topic %s: %w", topic, err)
		}
		if _, dup := out[topic]; dup {
			return nil, fmt.Errorf("topic %s has two dead-letter policies", topic)
		}
		out[topic] = policy
	}
	return out, nil
}

func (c Config) validatePolicies() error {
	if err := ValidPolicy(c.DeadLetterPolicy); err != nil {
		return err
	}
	for topic, p := range c.TopicPolicies {
		if err := ValidPolicy(p); err != nil {
			return fmt.Errorf("topic %s: %w", topic, err)
		}
	}
	return nil
}

// policy is the dead-letter policy of topic.
func (c Config) policy(topic string) string {
	if p, ok := c.TopicPolicies[topic]; ok {
		return p
	}
	return c.DeadLetterPolicy
}

type holdKey struct{ topic, key string }

// holds maps each held key to the outbox row id of the dead letter that
// holds it. The publisher reads and adds; the durability stage adds sink
// rejections; the read loop changes a key only while nothing is in flight
// (a release).
type holds struct {
	mu sync.Mutex
	by map[holdKey]int64
}

func (h *holds) holder(e Event) (int64, bool) {
	if e.Key == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	row, ok := h.by[holdKey{e.Topic, string(e.Key)}]
	return row, ok
}

func (h *holds) set(k holdKey, row int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if row == 0 {
		delete(h.by, k)
	} else {
		h.by[k] = row
	}
}

// loadHolds reads the held keys at the start of a pipeline.
func (r *Relay) loadHolds(ctx context.Context) error {
	held, err := r.store.LoadHolds(ctx, r.pool)
	if err != nil {
		return fmt.Errorf("reading the held keys: %w", err)
	}
	by := make(map[holdKey]int64, len(held))
	for _, h := range held {
		by[holdKey{h.Topic, h.Key}] = h.Row
	}
	r.holds.mu.Lock()
	r.holds.by = by
	r.holds.mu.Unlock()
	return nil
}

// deadLetterOf is the dead letter of a live event that cannot be published;
// under hold-key it holds the event's key from now on.
func (r *Relay) deadLetterOf(e Event, reason string, err error) deadLetter {
	d := deadLetter{event: e, reason: reason, err: err}
	if e.Key != nil && r.cfg.policy(e.Topic) == PolicyHoldKey {
		d.holds = true
		r.holds.set(holdKey{e.Topic, string(e.Key)}, e.ID)
	}
	return d
}

// heldOf returns the held row for a live event whose key is held.
func (r *Relay) heldOf(e Event) (deadLetter, bool) {
	row, held := r.holds.holder(e)
	if !held {
		return deadLetter{}, false
	}
	return deadLetter{event: e, reason: ReasonHeld, heldBy: row,
		err: fmt.Errorf("held behind the dead letter of outbox row %d (dead-letter policy %s)", row, PolicyHoldKey)}, true
}

// sampleHolds is the holds service's pass: it exports the held keys and
// events (every BacklogInterval, maintenance.go).
func (r *Relay) sampleHolds(ctx context.Context) error {
	keys, events, err := r.store.CountHolds(ctx, r.pool)
	if err != nil {
		return err
	}
	r.m.HeldKeys.Set(float64(keys))
	r.m.HeldEvents.Set(float64(events))
	return nil
}
