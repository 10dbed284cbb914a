package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"time"
)

// CloudEvents modes: how an event is presented as a CloudEvent (CloudEvents
// 1.0, Kafka protocol binding).
const (
	// CloudEventsOff publishes the row as it is (the default).
	CloudEventsOff = "off"
	// CloudEventsBinary adds the ce_* attribute headers; the payload is
	// untouched.
	CloudEventsBinary = "binary"
	// CloudEventsStructured wraps a JSON payload in the CloudEvents JSON
	// envelope; a payload it cannot wrap is dead-lettered.
	CloudEventsStructured = "structured"
)

// ReasonNotWrappable is the dead-letter reason of an event that structured
// CloudEvents mode cannot wrap (its payload is not JSON).
const ReasonNotWrappable = "cloudevents_unwrappable"

// ErrNotWrappable is the route error of ReasonNotWrappable.
var ErrNotWrappable = errors.New("cannot be wrapped in a structured CloudEvent")

// CloudEvents configures the CloudEvents presentation of published events.
type CloudEvents struct {
	// Mode applies to every topic not in Topics: off (default), binary
	// or structured.
	Mode string
	// Topics overrides Mode per topic.
	Topics map[string]string
	// Source is the ce_source attribute: a URI reference naming the
	// producer. It must be set when any mode is not off.
	Source string
	// SchemaURL, when set and the Validator names the schema id an event
	// was checked against (a SchemaIdentifier), makes ce_dataschema
	// SchemaURL + "/schemas/ids/<id>": the registry's REST path of that
	// schema.
	SchemaURL string
}

// A SchemaIdentifier is a Validator that names the registered schema a
// message's contract checks it against (internal/registry implements it).
type SchemaIdentifier interface {
	// SchemaID returns the schema id of msg's contract; false when no
	// contract applies.
	SchemaID(msg Message) (int, bool)
}

// ValidCloudEventsMode checks a mode's name.
func ValidCloudEventsMode(mode string) error {
	switch mode {
	case CloudEventsOff, CloudEventsBinary, CloudEventsStructured:
		return nil
	}
	return fmt.Errorf("CloudEvents mode %q: must be off, binary or structured", mode)
}

// mode returns the mode of topic.
func (c CloudEvents) mode(topic string) string {
	if m, ok := c.Topics[topic]; ok {
		return m
	}
	return c.Mode
}

// on reports whether any topic may get a mode other than off.
func (c CloudEvents) on() bool {
	if c.Mode != CloudEventsOff && c.Mode != "" {
		return true
	}
	for _, m := range c.Topics {
		if m != CloudEventsOff {
			return true
		}
	}
	return false
}

func (c CloudEvents) validate() error {
	if c.Mode != "" {
		if err := ValidCloudEventsMode(c.Mode); err != nil {
			return err
		}
	}
	for topic, m := range c.Topics {
		if err := ValidCloudEventsMode(m); err != nil {
			return fmt.Errorf("topic %s: %w", topic, err)
		}
	}
	if c.on() && c.Source == "" {
		return errors.New("CloudEvents need a source (the ce_source attribute)")
	}
	return nil
}

// The CloudEvents Kafka protocol binding's header names.
const (
	ceHeaderPrefix     = "ce_"
	ceSpecVersion      = "ce_specversion"
	ceID               = "ce_id"
	ceSource           = "ce_source"
	ceType             = "ce_type"
	ceTime             = "ce_time"
	ceDataContentType  = "ce_datacontenttype"
	ceDataSchema       = "ce_dataschema"
	headerContentType  = "content-type"
	contentTypeJSON    = "application/json"
	contentTypeCEJSON  = "application/cloudevents+json"
	cloudEventsVersion = "1.0"
)

// relayAttributes are the attributes the relay sets: a row's headers of
// these names are replaced (ce_type is taken from the row when it sets it).
var relayAttributes = map[string]bool{ceSpecVersion: true, ceID: true, ceSource: true, ceTime: true, ceDataContentType: true, ceDataSchema: true}

// attributes are an event's CloudEvents context attributes.
type attributes struct {
	id, source, typ, time, contentType, dataSchema string
}

// cloudEvent presents msg, routed from e, as a CloudEvent in its topic's
// mode. In binary mode the ce_* headers are added (and content-type when
// the row sets none and the payload is JSON); in structured mode a JSON
// payload becomes the data of the CloudEvents JSON envelope, with
// content-type application/cloudevents+json, and any other payload is a
// route error with ReasonNotWrappable. A tombstone (nil payload) stays a
// tombstone in both modes: it gets the binary headers, which keeps it a
// CloudEvent without data.
func (r *Relay) cloudEvent(e Event, msg Message) (Message, error) {
	ce := r.cfg.CloudEvents
	mode := ce.mode(msg.Topic)
	if mode == CloudEventsOff || mode == "" {
		return msg, nil
	}
	a := attributes{id: e.EventID, source: ce.Source, typ: msg.Topic, time: e.CreatedAt.UTC().Format(time.RFC3339Nano)}
	var rowContentType, rowType string
	for _, h := range msg.Headers {
		switch strings.ToLower(h.Key) {
		case headerContentType:
			rowContentType = string(h.Value)
		case ceType:
			rowType = string(h.Value)
		case "type":
			if rowType == "" {
				rowType = string(h.Value)
			}
		}
	}
	if rowType != "" {
		a.typ = rowType
	}
	isJSON := msg.Value != nil && json.Valid(msg.Value)
	switch {
	case rowContentType != "":
		a.contentType = rowContentType
	case isJSON:
		a.contentType = contentTypeJSON
	}
	if ce.SchemaURL != "" && msg.Value != nil {
		if si, ok := r.cfg.Validator.(SchemaIdentifier); ok {
			if id, ok := si.SchemaID(msg); ok {
				a.dataSchema = strings.TrimSuffix(ce.SchemaURL, "/") + "/schemas/ids/" + strconv.Itoa(id)
			}
		}
	}
	if mode == CloudEventsBinary || msg.Value == nil {
		msg.Headers = binaryHeaders(msg.Headers, a, rowContentType == "")
		return msg, nil
	}
	if !isJSON {
		return Message{}, &RouteError{Reason: ReasonNotWrappable, Err: fmt.Errorf("%w: structured mode wraps JSON payloads only, and this payload is not JSON: %s", ErrNotWrappable, truncate(msg.Value))}
	}
	if rowContentType != "" && !jsonMediaType(rowContentType) {
		return Message{}, &RouteError{Reason: ReasonNotWrappable, Err: fmt.Errorf("%w: structured mode wraps JSON payloads only, and the row's content-type is %q", ErrNotWrappable, rowContentType)}
	}
	value, err := envelope(a, msg.Value)
	if err != nil {
		return Message{}, &RouteError{Reason: ReasonNotWrappable, Err: fmt.Errorf("%w: %w", ErrNotWrappable, err)}
	}
	headers := make([]Header, 0, len(msg.Headers)+1)
	for _, h := range msg.Headers {
		if !strings.EqualFold(h.Key, headerContentType) {
			headers = append(headers, h)
		}
	}
	msg.Value = value
	msg.Headers = append(headers, Header{Key: headerContentType, Value: []byte(contentTypeCEJSON)})
	return msg, nil
}

// binaryHeaders returns the row's headers without those naming attributes
// the relay sets, then the attribute headers. addContentType adds the
// binding's content-type header (the row set none).
func binaryHeaders(row []Header, a attributes, addContentType bool) []Header {
	headers := make([]Header, 0, len(row)+8)
	for _, h := range row {
		if !relayAttributes[strings.ToLower(h.Key)] {
			headers = append(headers, h)
		}
	}
	hasType := false
	for _, h := range headers {
		if strings.ToLower(h.Key) == ceType {
			hasType = true
		}
	}
	headers = append(headers,
		Header{Key: ceSpecVersion, Value: []byte(cloudEventsVersion)},
		Header{Key: ceID, Value: []byte(a.id)},
		Header{Key: ceSource, Value: []byte(a.source)},
		Header{Key: ceTime, Value: []byte(a.time)},
	)
	if !hasType {
		headers = append(headers, Header{Key: ceType, Value: []byte(a.typ)})
	}
	if a.contentType != "" {
		headers = append(headers, Header{Key: ceDataContentType, Value: []byte(a.contentType)})
		if addContentType {
			headers = append(headers, Header{Key: headerContentType, Value: []byte(a.contentType)})
		}
	}
	if a.dataSchema != "" {
		headers = append(headers, Header{Key: ceDataSchema, Value: []byte(a.dataSchema)})
	}
	return headers
}

// jsonMediaType reports whether a content type is JSON: application/json
// or a +json suffix.
func jsonMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == contentTypeJSON || strings.HasSuffix(mt, "+json")
}

// envelope is the CloudEvents JSON format of an event whose data is the
// JSON document data (not re-encoded: only its surrounding whitespace is
// dropped).
func envelope(a attributes, data []byte) ([]byte, error) {
	type ceJSON struct {
		SpecVersion     string `json:"specversion"`
		ID              string `json:"id"`
		Source          string `json:"source"`
		Type            string `json:"type"`
		Time            string `json:"time"`
		DataContentType string `json:"datacontenttype,omitempty"`
		DataSchema      string `json:"dataschema,omitempty"`
	}
	head, err := json.Marshal(ceJSON{SpecVersion: cloudEventsVersion, ID: a.id, Source: a.source, Type: a.typ, Time: a.time,
		DataContentType: a.contentType, DataSchema: a.dataSchema})
	if err != nil {
		return nil, err
	}
	data = bytes.TrimSpace(data)
	out := make([]byte, 0, len(head)+len(data)+8)
	out = append(out, head[:len(head)-1]...)
	out = append(out, `,"data":`...)
	out = append(out, data...)
	return append(out, '}'), nil
}
