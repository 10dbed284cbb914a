package relay

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

// ceRelay is a relay that only routes, with CloudEvents configured.
func ceRelay(t *testing.T, ce CloudEvents, v Validator) *Relay {
	t.Helper()
	cfg := Config{CloudEvents: ce, Validator: v}.WithDefaults()
	if err := cfg.CloudEvents.validate(); err != nil {
		t.Fatal(err)
	}
	return &Relay{cfg: cfg, cloudEvents: cfg.CloudEvents.on()}
}

func headerMap(t *testing.T, hs []Header) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, h := range hs {
		if _, dup := m[h.Key]; dup {
			t.Errorf("header %s appears twice", h.Key)
		}
		m[h.Key] = string(h.Value)
	}
	return m
}

// schemaIDs is a Validator whose topic "contracted" has schema id 7.
type schemaIDs struct{}

func (schemaIDs) Refresh(context.Context) error        { return nil }
func (schemaIDs) Validate(msg Message) ([]byte, error) { return msg.Value, nil }
func (schemaIDs) SchemaID(msg Message) (int, bool)     { return 7, msg.Topic == "contracted" }

// TestCloudEventsBinary: binary mode adds the ce_* attribute headers with
// ce_id the event id, ce_type from the row's header or the topic, the
// content type from the row or application/json for a JSON payload, and
// ce_dataschema where a contract applies; the payload and the row's other
// headers are untouched, and the row cannot set the relay's attributes.
func TestCloudEventsBinary(t *testing.T) {
	created := time.Date(2026, 12, 7, 10, 11, 12, 345678000, time.FixedZone("x", 3600))
	r := ceRelay(t, CloudEvents{Mode: CloudEventsBinary, Source: "postgresql://db:5432/shop/outbox", SchemaURL: "http://registry:9464"}, nil)
	cases := []struct {
		name, topic, headers, payload string
		want                          map[string]string
	}{
		{"json, type from the topic", "orders", `{"trace":"t1"}`, `{"n":1}`, map[string]string{
			"ce_type": "orders", "ce_datacontenttype": "application/json", "content-type": "application/json", "trace": "t1"}},
		{"ce_type header", "orders", `{"ce_type":"com.shop.order.created","ce_subject":"o-1"}`, `{"n":1}`, map[string]string{
			"ce_type": "com.shop.order.created", "ce_subject": "o-1", "ce_datacontenttype": "application/json"}},
		{"type header", "orders", `{"type":"order.paid"}`, `[1,2]`, map[string]string{"ce_type": "order.paid", "type": "order.paid"}},
		{"row content type", "orders", `{"content-type":"text/plain"}`, `hello`, map[string]string{
			"ce_datacontenttype": "text/plain", "content-type": "text/plain"}},
		{"not json, no content type", "orders", ``, `hello`, map[string]string{"ce_type": "orders"}},
		{"forged attributes are replaced", "orders", `{"ce_id":"forged","ce_source":"elsewhere","CE_TIME":"never"}`, `{}`, map[string]string{
			"ce_source": "postgresql://db:5432/shop/outbox"}},
	}
	for _, c := range cases {
		var headers []byte
		if c.headers != "" {
			headers = []byte(c.headers)
		}
		e := Event{EventID: "0193e0a4-7f6e-7cc0-a000-000000000001", Topic: c.topic, Payload: []byte(c.payload), Headers: headers, CreatedAt: created}
		msg, err := r.route(e)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(msg.Value) != c.payload {
			t.Errorf("%s: payload %q, want it untouched", c.name, msg.Value)
		}
		h := headerMap(t, msg.Headers)
		if h["ce_id"] != e.EventID || h[HeaderEventID] != e.EventID || h["ce_specversion"] != "1.0" ||
			h["ce_time"] != "2026-12-07T09:11:12.345678Z" || h["ce_source"] != "postgresql://db:5432/shop/outbox" {
			t.Errorf("%s: attributes %v", c.name, h)
		}
		for k, v := range c.want {
			if h[k] != v {
				t.Errorf("%s: header %s = %q, want %q (all: %v)", c.name, k, h[k], v, h)
			}
		}
		if _, ok := h["ce_dataschema"]; ok {
			t.Errorf("%s: ce_dataschema without a contract", c.name)
		}
		if c.payload == "hello" && c.headers == "" {
			if _, ok := h["ce_datacontenttype"]; ok {
				t.Errorf("%s: a content type for a payload of unknown type: %v", c.name, h)
			}
		}
	}
	r = ceRelay(t, CloudEvents{Mode: CloudEventsBinary, Source: "s", SchemaURL: "http://registry:9464/"}, schemaIDs{})
	msg, err := r.route(Event{EventID: "e1", Topic: "contracted", Payload: []byte(`{}`), CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	if got := headerMap(t, msg.Headers)["ce_dataschema"]; got != "http://registry:9464/schemas/ids/7" {
		t.Errorf("ce_dataschema %q, want the registry's path of schema 7", got)
	}
}

// TestCloudEventsStructured: structured mode wraps a JSON payload in the
// CloudEvents JSON envelope, which the CloudEvents SDK reads and
// validates, with the payload as its data; a payload it cannot wrap is a
// route error with ReasonNotWrappable; a tombstone stays a tombstone with
// the binary headers; per-topic modes override the default.
func TestCloudEventsStructured(t *testing.T) {
	created := time.Date(2026, 12, 7, 10, 11, 12, 0, time.UTC)
	r := ceRelay(t, CloudEvents{Mode: CloudEventsStructured, Topics: map[string]string{"plain": CloudEventsOff, "bin": CloudEventsBinary},
		Source: "/outbox"}, nil)
	payload := ` {"order":"o-1","lines":[{"sku":"a<b","n":2}],"note":"caf\u00e9"}` + "\n"
	msg, err := r.route(Event{EventID: "ev-1", Topic: "orders", Payload: []byte(payload),
		Headers: []byte(`{"type":"order.created","content-type":"application/json","trace":"t"}`), CreatedAt: created})
	if err != nil {
		t.Fatal(err)
	}
	h := headerMap(t, msg.Headers)
	if h["content-type"] != "application/cloudevents+json" || h["trace"] != "t" || h[HeaderEventID] != "ev-1" {
		t.Errorf("headers %v", h)
	}
	var ev event.Event
	if err := json.Unmarshal(msg.Value, &ev); err != nil {
		t.Fatalf("the SDK cannot read the envelope %s: %v", msg.Value, err)
	}
	if err := ev.Validate(); err != nil {
		t.Fatalf("the SDK finds the event invalid: %v", err)
	}
	if ev.ID() != "ev-1" || ev.Source() != "/outbox" || ev.Type() != "order.created" || !ev.Time().Equal(created) ||
		ev.DataContentType() != "application/json" || ev.SpecVersion() != "1.0" {
		t.Errorf("event %v", ev)
	}
	var got, want any
	json.Unmarshal(ev.Data(), &got)
	json.Unmarshal([]byte(payload), &want)
	if gb, _ := json.Marshal(got); string(gb) != mustJSON(want) {
		t.Errorf("data %s, want the payload %s", ev.Data(), payload)
	}

	// A +json media type is JSON to the CloudEvents JSON format, and kept
	// (the Go SDK reads data as JSON only for application/json).
	msg, err = r.route(Event{EventID: "ev-6", Topic: "orders", Payload: []byte(`{"a":1}`), Headers: []byte(`{"content-type":"application/vnd.shop+json"}`), CreatedAt: created})
	var env struct {
		DataContentType string         `json:"datacontenttype"`
		Data            map[string]int `json:"data"`
	}
	if err != nil || json.Unmarshal(msg.Value, &env) != nil || env.DataContentType != "application/vnd.shop+json" || env.Data["a"] != 1 {
		t.Errorf("+json payload: %v %s", err, msg.Value)
	}

	for _, c := range []struct{ payload, headers string }{{"not json", "null"}, {`{"a":1}`, `{"content-type":"application/xml"}`}} {
		_, err := r.route(Event{EventID: "ev-2", Topic: "orders", Payload: []byte(c.payload), Headers: []byte(c.headers), CreatedAt: created})
		var re *RouteError
		if !errors.As(err, &re) || re.Reason != ReasonNotWrappable || !errors.Is(err, ErrNotWrappable) || !strings.Contains(err.Error(), "structured mode wraps JSON payloads only") {
			t.Errorf("payload %q headers %s: %v, want a route error %s", c.payload, c.headers, err, ReasonNotWrappable)
		}
	}

	msg, err = r.route(Event{EventID: "ev-3", Topic: "orders", Key: []byte("k"), CreatedAt: created})
	if err != nil || msg.Value != nil || headerMap(t, msg.Headers)["ce_id"] != "ev-3" {
		t.Errorf("tombstone: %v %q %v, want a tombstone with the binary headers", err, msg.Value, msg.Headers)
	}
	msg, err = r.route(Event{EventID: "ev-4", Topic: "plain", Payload: []byte("x"), CreatedAt: created})
	if err != nil || string(msg.Value) != "x" || len(msg.Headers) != 2 {
		t.Errorf("topic off: %v %q %v, want the event as it is", err, msg.Value, msg.Headers)
	}
	msg, err = r.route(Event{EventID: "ev-5", Topic: "bin", Payload: []byte("x"), CreatedAt: created})
	if err != nil || string(msg.Value) != "x" || headerMap(t, msg.Headers)["ce_id"] != "ev-5" {
		t.Errorf("topic binary: %v %q %v", err, msg.Value, msg.Headers)
	}
}

// TestCloudEventsSize: an event that fits the limit as a row but not as a
// CloudEvent is too large.
func TestCloudEventsSize(t *testing.T) {
	r := ceRelay(t, CloudEvents{Mode: CloudEventsStructured, Source: "/outbox"}, nil)
	r.cfg.MaxMessageBytes = 200
	_, err := r.route(Event{EventID: "ev", Topic: "orders", Payload: []byte(`{"pad":"` + strings.Repeat("x", 100) + `"}`), CreatedAt: time.Now()})
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("%v, want too large", err)
	}
}

// TestCloudEventsConfig: modes are checked, and a mode needs a source.
func TestCloudEventsConfig(t *testing.T) {
	for _, c := range []CloudEvents{{Mode: "json", Source: "s"}, {Topics: map[string]string{"t": "Binary"}, Source: "s"}, {Mode: CloudEventsBinary}, {Topics: map[string]string{"t": CloudEventsStructured}}} {
		if err := c.validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	for _, c := range []CloudEvents{{}, {Mode: CloudEventsOff}, {Topics: map[string]string{"t": CloudEventsOff}}, {Mode: CloudEventsBinary, Source: "s"}} {
		if err := c.validate(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
