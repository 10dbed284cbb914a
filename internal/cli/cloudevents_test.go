package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// ceRecord is a Kafka record as a CloudEvents SDK message, read the way the
// CloudEvents Kafka protocol binding reads one: structured when its
// content-type is application/cloudevents+json, binary when it has a
// ce_specversion header (ce_* headers are attributes or extensions,
// content-type is datacontenttype).
type ceRecord struct{ r *kgo.Record }

var ceSpecs = spec.WithPrefix("ce_")

func (m ceRecord) header(name string) (string, bool) {
	for _, h := range m.r.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

func (m ceRecord) ReadEncoding() binding.Encoding {
	if ct, _ := m.header("content-type"); format.Lookup(ct) != nil {
		return binding.EncodingStructured
	}
	if _, ok := m.header(ceSpecs.PrefixedSpecVersionName()); ok {
		return binding.EncodingBinary
	}
	return binding.EncodingUnknown
}

func (m ceRecord) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	ct, _ := m.header("content-type")
	f := format.Lookup(ct)
	if f == nil {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, f, bytes.NewReader(m.r.Value))
}

func (m ceRecord) ReadBinary(ctx context.Context, w binding.BinaryWriter) error {
	sv, _ := m.header(ceSpecs.PrefixedSpecVersionName())
	v := ceSpecs.Version(sv)
	if v == nil {
		return binding.ErrNotBinary
	}
	for _, h := range m.r.Headers {
		switch {
		case h.Key == "content-type":
			if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), string(h.Value)); err != nil {
				return err
			}
		case strings.HasPrefix(h.Key, "ce_"):
			var err error
			if a := v.Attribute(h.Key); a != nil {
				err = w.SetAttribute(a, string(h.Value))
			} else {
				err = w.SetExtension(strings.TrimPrefix(h.Key, "ce_"), string(h.Value))
			}
			if err != nil {
				return err
			}
		}
	}
	if m.r.Value != nil {
		return w.SetData(bytes.NewReader(m.r.Value))
	}
	return nil
}

func (m ceRecord) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	sv, _ := m.header(ceSpecs.PrefixedSpecVersionName())
	v := ceSpecs.Version(sv)
	if v == nil {
		return nil, nil
	}
	a := v.AttributeFromKind(k)
	if a == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		if ct, ok := m.header("content-type"); ok {
			return a, ct
		}
	}
	if val, ok := m.header(a.PrefixedName()); ok {
		return a, val
	}
	return a, nil
}

func (m ceRecord) GetExtension(name string) any {
	if val, ok := m.header("ce_" + name); ok {
		return val
	}
	return nil
}

func (m ceRecord) Finish(error) error { return nil }

// TestCloudEvents runs the relay with --cloudevents binary, a topic
// declared structured and one declared off in its config file, and a JSON
// Schema contract on one topic, then reads the records back through the
// Kafka listener with the CloudEvents Go SDK: every record of the binary
// and structured topics is a valid CloudEvent with the event id as its id,
// the default source naming the database and schema (no credentials),
// the type from the row's header or the topic, the creation time,
// the content type, and the registry's schema URL as dataschema on the
// contract topic; binary payloads are untouched; the off topic has no
// ce_* header; the structured topic's non-JSON event is a dead letter with
// reason cloudevents_unwrappable.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr, dataDir := e2e.FreeAddr(t), e2e.FreeAddr(t), e2e.DataDir(t)
	cfgPath := filepath.Join(t.TempDir(), "relay.yaml")
	writeFile(t, cfgPath, `cloudevents: binary
topics:
  ce-struct:
    partitions: 1
    cloudevents: structured
  ce-off:
    partitions: 1
    cloudevents: off
`)
	p := e2e.Start(t, bin, nil, "run", "--config", cfgPath, "--database-url", url, "--data-dir", dataDir,
		"--http-addr", httpAddr, "--kafka-addr", kafkaAddr, "--poll-interval", "100ms", "--partitions", "1",
		"--schema-registry", "--schema-topics", "ce-bin")
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	body, _ := json.Marshal(map[string]string{"schemaType": "JSON", "schema": `{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`})
	resp, err := http.Post("http://"+httpAddr+"/subjects/ce-bin-value/versions", "application/vnd.schemaregistry.v1+json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var reg struct{ ID int }
	json.NewDecoder(resp.Body).Decode(&reg)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || reg.ID == 0 {
		t.Fatalf("registering the schema: %d", resp.StatusCode)
	}

	conn := pgtest.Connect(t, url)
	type row struct{ topic, headers, payload string }
	rows := []row{
		{"ce-bin", `{"ce_type":"com.shop.order.created","ce_subject":"o-1"}`, `{"n":1}`},
		{"ce-bin", ``, `{"n": 2}`},
		{"ce-struct", `{"type":"order.paid"}`, `{"n":3,"s":"<&>"}`},
		{"ce-struct", ``, `not json`},
		{"ce-off", ``, `{"n":4}`},
	}
	ids := map[string]string{} // payload -> event id
	var created = map[string]time.Time{}
	for _, r := range rows {
		var headers any
		if r.headers != "" {
			headers = r.headers
		}
		var id string
		var at time.Time
		if err := conn.QueryRow(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ($1, 'k', $2, $3) RETURNING event_id::text, created_at`,
			r.topic, []byte(r.payload), headers).Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		ids[r.payload], created[r.payload] = id, at
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	var database string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	read := func(topic string, n int) []*kgo.Record {
		t.Helper()
		cl := kafkaClient(t, kafkaAddr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		var out []*kgo.Record
		for len(out) < n {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("%s: read %d of %d records", topic, len(out), n)
			}
			out = append(out, fs.Records()...)
		}
		return out
	}
	toEvent := func(r *kgo.Record) *event.Event {
		t.Helper()
		ev, err := binding.ToEvent(ctx, ceRecord{r})
		if err != nil {
			t.Fatalf("%s/%d: the SDK cannot read the record: %v", r.Topic, r.Offset, err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("%s/%d: the SDK finds the event invalid: %v", r.Topic, r.Offset, err)
		}
		return ev
	}
	check := func(ev *event.Event, payload, typ string) {
		t.Helper()
		if ev.ID() != ids[payload] {
			t.Errorf("event %s: id %q, want the event id %s", payload, ev.ID(), ids[payload])
		}
		src := ev.Source()
		if !strings.HasPrefix(src, "postgresql://") || !strings.HasSuffix(src, "/"+database+"/outbox") || strings.Contains(src, "@") {
			t.Errorf("event %s: source %q, want postgresql://<host>/%s/outbox without credentials", payload, src, database)
		}
		if ev.Type() != typ {
			t.Errorf("event %s: type %q, want %q", payload, ev.Type(), typ)
		}
		if !ev.Time().Equal(created[payload]) {
			t.Errorf("event %s: time %v, want the row's creation %v", payload, ev.Time(), created[payload])
		}
		if ev.DataContentType() != "application/json" {
			t.Errorf("event %s: datacontenttype %q", payload, ev.DataContentType())
		}
	}

	wantSchema := "http://" + httpAddr + "/schemas/ids/" + strconv.Itoa(reg.ID)
	for i, r := range read("ce-bin", 2) {
		ev := toEvent(r)
		payload := rows[i].payload
		check(ev, payload, map[int]string{0: "com.shop.order.created", 1: "ce-bin"}[i])
		if string(r.Value) != payload || string(ev.Data()) != payload {
			t.Errorf("binary record %d: value %q, data %q, want the payload %q untouched", i, r.Value, ev.Data(), payload)
		}
		if ev.DataSchema() != wantSchema {
			t.Errorf("binary record %d: dataschema %q, want %q", i, ev.DataSchema(), wantSchema)
		}
		if i == 0 && ev.Subject() != "o-1" {
			t.Errorf("binary record 0: subject %q, want the row's ce_subject", ev.Subject())
		}
	}
	recs := read("ce-struct", 1)
	if len(recs) != 1 {
		t.Fatalf("ce-struct has %d records, want 1", len(recs))
	}
	ev := toEvent(recs[0])
	check(ev, `{"n":3,"s":"<&>"}`, "order.paid")
	var data map[string]any
	if err := json.Unmarshal(ev.Data(), &data); err != nil || data["n"] != 3.0 || data["s"] != "<&>" {
		t.Errorf("structured data %s: %v", ev.Data(), err)
	}
	for _, r := range read("ce-off", 1) {
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "ce_") || h.Key == "content-type" {
				t.Errorf("topic declared off: header %s", h.Key)
			}
		}
	}
	var reason, msg string
	if err := conn.QueryRow(ctx, `SELECT reason, error FROM outbox.dead_letters WHERE event_id = $1`, ids["not json"]).Scan(&reason, &msg); err != nil {
		t.Fatalf("the structured topic's non-JSON event is not a dead letter: %v", err)
	}
	if reason != "cloudevents_unwrappable" || !strings.Contains(msg, "not JSON") {
		t.Errorf("dead letter: reason %q, error %q", reason, msg)
	}
	p.Stop(30 * time.Second)
}

// TestCloudEventsKafkaSink: with the Kafka sink (a kfake cluster), the
// structured envelope and the binary headers reach the Kafka records, and
// the CloudEvents Go SDK reads them with the event id as their id.
func TestCloudEventsKafkaSink(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	cluster := kafkatest.Start(t)
	cfgPath := filepath.Join(t.TempDir(), "relay.yaml")
	writeFile(t, cfgPath, "topics:\n  ks-struct:\n    cloudevents: structured\n")
	p := e2e.Start(t, bin, nil, "run", "--config", cfgPath, "--database-url", url, "--sink", "kafka",
		"--kafka-brokers", strings.Join(cluster.Addrs(), ","), "--kafka-create-topics", "--kafka-topic-partitions", "1",
		"--data-dir", e2e.DataDir(t), "--http-addr", e2e.FreeAddr(t), "--poll-interval", "100ms",
		"--cloudevents", "binary", "--cloudevents-source", "urn:shop:orders")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn := pgtest.Connect(t, url)
	ids := map[string]string{}
	for _, topic := range []string{"ks-bin", "ks-struct"} {
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ($1, 'k', '{"n":1}') RETURNING event_id::text`, topic).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[topic] = id
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	for topic, id := range ids {
		cl := kafkaClient(t, cluster.Addrs()[0], kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		var recs []*kgo.Record
		for len(recs) == 0 {
			fs := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("%s: no record", topic)
			}
			recs = fs.Records()
		}
		ev, err := binding.ToEvent(ctx, ceRecord{recs[0]})
		if err == nil {
			err = ev.Validate()
		}
		if err != nil {
			t.Fatalf("%s: the SDK cannot read a valid event: %v", topic, err)
		}
		if ev.ID() != id || ev.Source() != "urn:shop:orders" || ev.Type() != topic || string(ev.Data()) != `{"n":1}` {
			t.Errorf("%s: event %v", topic, ev)
		}
		if enc := (ceRecord{recs[0]}).ReadEncoding(); (topic == "ks-struct") != (enc == binding.EncodingStructured) {
			t.Errorf("%s: encoding %v", topic, enc)
		}
	}
	p.Stop(30 * time.Second)
}
