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
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	// Headers are published as record headers.
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
	for i, e := range events {
		topics[i], keys[i], payloads[i] = e.Topic, e.Key, e.Payload
		if e.Headers != nil {
			h, err := json.Marshal(e.Headers)
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
