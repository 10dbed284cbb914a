package relay

import (
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/jackc/pgx/v5"
)

// An event a source delivered without its content (Event.TooLarge: the
// row is above MaxMessageBytes) is dead-lettered without the relay ever
// holding the content: the acknowledgement copies the row into the dead
// letters with INSERT ... SELECT, before it deletes the row, in the same
// transaction. The dead letter keeps the whole payload, so that `relay
// dead-letters retry` can put it back once the limit is raised.
//
// Faults: the copy and the deletion commit together, so a crash before the
// commit leaves the row in the outbox and no dead letter; the row is read
// and dead-lettered again. A row deleted by someone else between the read
// and the acknowledgement is recorded from what the source delivered (no
// key, payload or headers), with a note in its error. Only the poll reader
// delivers such events: it read the row, so the row is visible to the
// acknowledgement's snapshot (the WAL reader may deliver a row before it is
// visible, and delivers every row whole).

// route is Route, for an event with its content or without it, followed
// by the schema contract's check when there is a Validator, then the
// CloudEvents presentation of the event's topic (cloudevents.go).
func (r *Relay) route(e Event) (Message, error) {
	if e.TooLarge > 0 {
		return Message{}, &RouteError{Reason: ReasonTooLarge, Err: fmt.Errorf("%w: %d bytes of key, payload and headers (as JSON text), the limit is %d",
			ErrTooLarge, e.TooLarge, r.cfg.MaxMessageBytes)}
	}
	msg, err := Route(e, r.cfg.MaxMessageBytes)
	if err != nil {
		return msg, err
	}
	if r.cfg.Validator != nil && msg.Value != nil {
		if msg.Value, err = r.cfg.Validator.Validate(msg); err != nil {
			return Message{}, &RouteError{Reason: ReasonSchemaInvalid, Err: err}
		}
	}
	if !r.cloudEvents {
		return msg, nil
	}
	if msg, err = r.cloudEvent(e, msg); err != nil {
		return msg, err
	}
	if size := msg.size(); size > r.cfg.MaxMessageBytes {
		return Message{}, &RouteError{Reason: ReasonTooLarge, Err: fmt.Errorf("%w: %d bytes of key, payload and headers as a CloudEvent, the limit is %d", ErrTooLarge, size, r.cfg.MaxMessageBytes)}
	}
	return msg, nil
}

// size is the sum of m's key, value and headers.
func (m Message) size() int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

type routed struct {
	msg Message
	err error
}

// routeAll routes events, in parallel chunks when a Validator checks
// them: validation is the costly part of routing and independent per event.
func (r *Relay) routeAll(events []Event) []routed {
	out := make([]routed, len(events))
	workers := min(runtime.GOMAXPROCS(0), len(events)/64)
	if r.cfg.Validator == nil || workers < 2 {
		for i, e := range events {
			out[i].msg, out[i].err = r.route(e)
		}
		return out
	}
	var wg sync.WaitGroup
	chunk := (len(events) + workers - 1) / workers
	for start := 0; start < len(events); start += chunk {
		end := min(start+chunk, len(events))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := start; i < end; i++ {
				out[i].msg, out[i].err = r.route(events[i])
			}
		}()
	}
	wg.Wait()
	return out
}

// deadLetterRows copies the rows of the dead letters delivered without
// their content into the dead-letter table. A row someone else deleted
// meanwhile is recorded from what the source delivered, without a payload.
func (r *Relay) deadLetterRows(ctx context.Context, tx pgx.Tx, acks []ack) error {
	var dead []deadLetter
	for _, a := range acks {
		for _, d := range a.dead {
			if d.event.TooLarge > 0 {
				dead = append(dead, d)
			}
		}
	}
	if len(dead) == 0 {
		return nil
	}
	for _, d := range dead {
		row := d.row()
		copied, err := r.store.CopyDeadLetter(ctx, tx, row)
		if err != nil {
			return fmt.Errorf("moving event %s to the dead letters: %w", d.event.EventID, err)
		}
		if copied {
			continue
		}
		row.Error += " (the row was deleted before it could be copied)"
		if err := r.store.InsertDeadLetter(ctx, tx, row); err != nil {
			return fmt.Errorf("moving event %s to the dead letters: %w", d.event.EventID, err)
		}
	}
	return nil
}
