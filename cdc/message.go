package cdc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay"
)

// messagePrefix is the prefix of the logical messages <schema>.emit_message
// writes (migration 012): "relay:" and the schema as a quoted identifier.
func messagePrefix(schema string) string { return "relay:" + pgx.Identifier{schema}.Sanitize() }

// messageMeta is the JSON part of an emit_message message.
type messageMeta struct {
	EventID   string          `json:"event_id"`
	Topic     *string         `json:"topic"`
	Key       *string         `json:"key"`
	Headers   json.RawMessage `json:"headers"`
	CreatedAt time.Time       `json:"created_at"`
	Tombstone bool            `json:"tombstone"`
}

// messageEvent turns a transactional emit_message message into its event:
// the JSON before the first zero byte holds everything but the payload,
// which follows it. The event has no row: its ID is the negated LSN of the
// message, unique and negative (relay.Event.HasRow). A message that does
// not parse (one written by hand with the relay's prefix) becomes an event
// whose topic says what is wrong, which no Kafka topic can be, so the core
// dead-letters it with the whole content as payload instead of the stream
// stopping.
func messageEvent(m *pglogrepl.LogicalDecodingMessage) relay.Event {
	e := relay.Event{ID: -int64(m.LSN)}
	meta, payload, err := parseMessage(m.Content)
	if err != nil {
		e.EventID = "00000000-0000-0000-0000-000000000000"
		e.Topic = "malformed emit_message content at " + m.LSN.String() + ": " + err.Error()
		e.Payload = append([]byte(nil), m.Content...)
		return e
	}
	e.EventID, e.Topic, e.CreatedAt = meta.EventID, *meta.Topic, meta.CreatedAt
	if meta.Key != nil {
		e.Key = []byte(*meta.Key)
	}
	if len(meta.Headers) > 0 && string(meta.Headers) != "null" {
		e.Headers = append([]byte(nil), meta.Headers...)
	}
	if !meta.Tombstone {
		e.Payload = append(make([]byte, 0, len(payload)), payload...)
	}
	return e
}

func parseMessage(content []byte) (messageMeta, []byte, error) {
	var meta messageMeta
	i := bytes.IndexByte(content, 0)
	if i < 0 {
		return meta, nil, fmt.Errorf("no zero byte after the metadata")
	}
	if err := json.Unmarshal(content[:i], &meta); err != nil {
		return meta, nil, fmt.Errorf("metadata: %w", err)
	}
	if meta.Topic == nil || meta.EventID == "" || meta.CreatedAt.IsZero() {
		return meta, nil, fmt.Errorf("metadata lacks topic, event_id or created_at")
	}
	return meta, content[i+1:], nil
}
