package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/outboxrelay/relay/internal/topicname"
)

// Reasons an event is moved to the dead letters; also the "reason" label of
// the dead-letter metric.
const (
	ReasonInvalidTopic   = "invalid_topic"
	ReasonInvalidHeaders = "invalid_headers"
	ReasonTooLarge       = "too_large"
	ReasonSinkRejected   = "sink_rejected"
	ReasonSchemaInvalid  = "schema_invalid"
)

// RouteError is why an event cannot become a message.
type RouteError struct {
	Reason string
	Err    error
}

func (e *RouteError) Error() string { return e.Err.Error() }
func (e *RouteError) Unwrap() error { return e.Err }

// ErrInvalidTopic, ErrInvalidHeaders and ErrTooLarge are the route errors.
var (
	ErrInvalidTopic   = errors.New("invalid topic")
	ErrInvalidHeaders = errors.New("invalid headers")
	ErrTooLarge       = errors.New("event too large")
)

// A Validator checks each message on a topic with a schema contract
// before it is published (internal/registry implements it). The core calls
// Refresh before routing each batch and Validate for each routed message
// with a payload.
type Validator interface {
	// Refresh brings the contracts up to date. An error fails the
	// pipeline, which restarts: events are never judged by contracts that
	// could not be read.
	Refresh(ctx context.Context) error
	// Validate returns the value to publish (the payload, or the payload
	// framed for its schema), or why the payload breaks its topic's
	// contract: the event then goes to the dead letters with
	// ReasonSchemaInvalid. It must not block.
	Validate(msg Message) ([]byte, error)
}

// ValidTopic checks Kafka's topic rules: 1 to 249 characters from
// [a-zA-Z0-9._-], and neither "." nor "..".
func ValidTopic(topic string) error {
	if err := topicname.Check(topic); err != nil {
		return fmt.Errorf("%w %w", ErrInvalidTopic, err)
	}
	return nil
}

// Route turns an event into its message: the topic and key from the row,
// the row's headers (sorted by name) followed by the event id and creation
// time, and the creation time as the timestamp. maxBytes bounds the sum of
// key, value and headers.
func Route(e Event, maxBytes int) (Message, error) {
	if err := ValidTopic(e.Topic); err != nil {
		return Message{}, &RouteError{Reason: ReasonInvalidTopic, Err: err}
	}
	headers, err := parseHeaders(e.Headers)
	if err != nil {
		return Message{}, &RouteError{Reason: ReasonInvalidHeaders, Err: err}
	}
	headers = append(headers,
		Header{Key: HeaderEventID, Value: []byte(e.EventID)},
		Header{Key: HeaderCreatedAt, Value: []byte(e.CreatedAt.UTC().Format(time.RFC3339Nano))},
	)
	size := len(e.Key) + len(e.Payload)
	for _, h := range headers {
		size += len(h.Key) + len(h.Value)
	}
	if size > maxBytes {
		return Message{}, &RouteError{Reason: ReasonTooLarge, Err: fmt.Errorf("%w: %d bytes of key, payload and headers, the limit is %d", ErrTooLarge, size, maxBytes)}
	}
	return Message{Topic: e.Topic, Key: e.Key, Value: e.Payload, Headers: headers, Timestamp: e.CreatedAt}, nil
}

// reservedHeaderPrefix starts the names of the headers the relay adds
// (relay-event-id, relay-created-at, relay-replay). A row may not set them:
// consumers deduplicate by relay-event-id, so it must not be forgeable.
const reservedHeaderPrefix = "relay-"

func parseHeaders(raw []byte) ([]Header, error) {
	if raw == nil || string(raw) == "null" {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%w: must be a JSON object of string values: %s", ErrInvalidHeaders, truncate(raw))
	}
	names := make([]string, 0, len(obj))
	for name := range obj {
		names = append(names, name)
	}
	sort.Strings(names)
	headers := make([]Header, 0, len(names)+2)
	for _, name := range names {
		if len(name) >= len(reservedHeaderPrefix) && strings.EqualFold(name[:len(reservedHeaderPrefix)], reservedHeaderPrefix) {
			return nil, fmt.Errorf("%w: header %q: names starting with %q belong to the relay", ErrInvalidHeaders, name, reservedHeaderPrefix)
		}
		var v *string
		if err := json.Unmarshal(obj[name], &v); err != nil {
			return nil, fmt.Errorf("%w: header %q is %s, not a string", ErrInvalidHeaders, name, truncate(obj[name]))
		}
		h := Header{Key: name}
		if v != nil {
			h.Value = []byte(*v)
		}
		headers = append(headers, h)
	}
	return headers, nil
}

func truncate(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
