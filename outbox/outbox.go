// Package outbox is the write side of Relay for Go services: it inserts
// events into the outbox table inside the caller's transaction, so the
// events commit or roll back together with the business rows.
//
//	tx, _ := conn.Begin(ctx)
//	tx.Exec(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1", id)
//	outbox.Emit(ctx, tx, outbox.Event{Topic: "orders", Key: id, Payload: body})
//	tx.Commit(ctx)
//
// Relay publishes each committed event once, in commit order per key.
//
// # Trace context
//
// Emit injects the trace context of ctx into each event's headers through
// OpenTelemetry's global propagator (otel.SetTextMapPropagator; with the
// W3C propagators: traceparent, tracestate and baggage), so the record
// carries the trace of the request that wrote it and a relay with tracing
// on continues it. A header the event already sets is kept as it is.
// Without a propagator configured (OpenTelemetry's default is a no-op) or
// without a span in ctx, nothing is added.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// DefaultSchema is the schema `relay migrate` creates unless told otherwise.
const DefaultSchema = "outbox"

// Event is one message for the outbox.
type Event struct {
	// Topic is the destination topic; Kafka's rules apply
	// ([a-zA-Z0-9._-], 1..249 characters). A bad topic is not rejected here:
	// Relay moves the event to its dead-letter table.
	Topic string
	// Key picks the partition and so the order. Empty means no key (NULL):
	// use SQL to publish an empty-string key.
	Key string
	// Payload is the record value; nil is a tombstone.
	Payload []byte
	// Headers are published as record headers. Emit adds the trace
	// context of its ctx (see the package doc) to those not set here.
	Headers map[string]string
}

// Writer writes events into one outbox schema.
type Writer struct {
	insert string
}

// NewWriter returns a Writer for schema ("" means DefaultSchema).
func NewWriter(schema string) *Writer {
	if schema == "" {
		schema = DefaultSchema
	}
	table := pgx.Identifier{schema, "events"}.Sanitize()
	return &Writer{insert: `INSERT INTO ` + table + ` (topic, key, payload, headers)
SELECT t, NULLIF(k, ''), p, h FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[]) AS e(t, k, p, h)
RETURNING event_id`}
}

var defaultWriter = NewWriter(DefaultSchema)

// Emit writes events into the default schema's outbox within tx and returns
// their event ids in order. See Writer.Emit.
func Emit(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	return defaultWriter.Emit(ctx, tx, events...)
}

// Emit writes events within tx, in one statement, and returns their event
// ids in order. Nothing is visible to Relay until tx commits; a rollback
// discards them with the rest of the transaction.
func (w *Writer) Emit(ctx context.Context, tx pgx.Tx, events ...Event) ([]uuid.UUID, error) {
	if tx == nil {
		return nil, errors.New("outbox: Emit needs a transaction")
	}
	if len(events) == 0 {
		return nil, nil
	}
	topics := make([]string, len(events))
	keys := make([]string, len(events))
	payloads := make([][]byte, len(events))
	headers := make([][]byte, len(events))
	traced := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, traced)
	for i, e := range events {
		topics[i], keys[i], payloads[i] = e.Topic, e.Key, e.Payload
		hs := withTrace(e.Headers, traced)
		if hs != nil {
			h, err := json.Marshal(hs)
			if err != nil {
				return nil, fmt.Errorf("outbox: encoding headers: %w", err)
			}
			headers[i] = h
		}
	}
	rows, err := tx.Query(ctx, w.insert, topics, keys, payloads, headers)
	if err != nil {
		return nil, fmt.Errorf("outbox: inserting events: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("outbox: inserting events: %w", err)
	}
	return ids, nil
}

// withTrace returns headers with the trace headers added where headers
// does not set them; a new map when it adds any, headers itself otherwise.
func withTrace(headers map[string]string, traced propagation.MapCarrier) map[string]string {
	if len(traced) == 0 {
		return headers
	}
	out := make(map[string]string, len(headers)+len(traced))
	for k, v := range traced {
		out[k] = v
	}
	for k, v := range headers {
		out[k] = v
	}
	return out
}
