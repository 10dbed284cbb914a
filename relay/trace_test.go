package relay

import (
	"errors"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceBatch: a durable batch gives each traced event a producer span
// in its trace, child of the writer's span, from its commit (or creation)
// to now, with the messaging attributes and its placement; an event the
// sink refused has status error; untraced events get none; the batch span
// links to every traced event and names its topic only when it has one;
// the dwell histogram's exemplar carries the trace id.
func TestTraceBatch(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := &Relay{cfg: Config{Tracer: tp.Tracer("test")}, m: NewMetrics()}

	created := time.Now().Add(-2 * time.Second)
	committed := created.Add(time.Second)
	const (
		tidA = "4bf92f3577b34da6a3ce929d0e0e4736"
		tidB = "0af7651916cd43dd8448eb211c80319c"
	)
	events := []Event{
		{EventID: "e-a", Topic: "orders", CreatedAt: created, CommittedAt: committed, Headers: []byte(`{"traceparent":"00-` + tidA + `-00f067aa0ba902b7-01"}`)},
		{EventID: "e-plain", Topic: "orders", CreatedAt: created},
		{EventID: "e-b", Topic: "payments", CreatedAt: created, Headers: []byte(`{"traceparent":"00-` + tidB + `-b7ad6b7169203331-01"}`)},
	}
	var msgs []Message
	for _, e := range events {
		m, err := Route(e, DefaultMaxMessageBytes)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	sent := time.Now().Add(-time.Millisecond)
	res := PublishResult{
		Failed:     map[int]error{2: errors.New("topic payments refused")},
		Placements: []Placement{{Partition: 1, Offset: 41}, {Partition: 0, Offset: 7}, {Partition: -1, Offset: -1}},
	}
	traced := r.traceBatch(flight{msgs: msgs, routed: events, sent: sent}, res)
	a := ack{byTopic: map[string]int{}}
	r.settle(&a, events, res, traced)

	if traced[1].IsValid() || !traced[0].IsValid() || !traced[2].IsValid() {
		t.Fatalf("span contexts %v: want the traced events' only", traced)
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans ended, want 2 events' and the batch's", len(spans))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()+" "+s.SpanContext().TraceID().String()] = s
	}
	ev := byName["send orders "+tidA]
	if ev == nil {
		t.Fatalf("no span \"send orders\" in trace %s: %v", tidA, byName)
	}
	if ev.Parent().SpanID().String() != "00f067aa0ba902b7" || ev.SpanKind() != trace.SpanKindProducer {
		t.Errorf("event span: parent %s kind %v", ev.Parent().SpanID(), ev.SpanKind())
	}
	if !ev.StartTime().Equal(committed) || ev.EndTime().Before(sent) {
		t.Errorf("event span from %v to %v, want from the commit %v to the acknowledgement", ev.StartTime(), ev.EndTime(), committed)
	}
	attrs := attribute.NewSet(ev.Attributes()...)
	for k, want := range map[attribute.Key]string{
		"messaging.system": "kafka", "messaging.destination.name": "orders", "messaging.message.id": "e-a",
		"messaging.destination.partition.id": "1", "messaging.operation.type": "send",
	} {
		if v, _ := attrs.Value(k); v.Emit() != want {
			t.Errorf("event span %s = %q, want %q", k, v.Emit(), want)
		}
	}
	if v, _ := attrs.Value("messaging.kafka.offset"); v.AsInt64() != 41 {
		t.Errorf("event span offset %v, want 41", v.Emit())
	}
	refused := byName["send payments "+tidB]
	if refused == nil || refused.Status().Code != codes.Error || !strings.Contains(refused.Status().Description, "refused") {
		t.Errorf("the refused event's span: %v", refused)
	} else if set := attribute.NewSet(refused.Attributes()...); set.HasValue("messaging.destination.partition.id") {
		t.Errorf("the refused event's span names a partition")
	}
	var batch sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == "send" {
			batch = s
		}
	}
	if batch == nil {
		t.Fatalf("no batch span \"send\" (two topics): %v", byName)
	}
	batchAttrs := attribute.NewSet(batch.Attributes()...)
	if n, _ := batchAttrs.Value("messaging.batch.message_count"); n.AsInt64() != 3 || len(batch.Links()) != 2 || !batch.StartTime().Equal(sent) {
		t.Errorf("batch span: count %v, %d links, start %v", n.Emit(), len(batch.Links()), batch.StartTime())
	}

	var m dto.Metric
	if err := r.m.Dwell.WithLabelValues("orders").(interface{ Write(*dto.Metric) error }).Write(&m); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range m.GetHistogram().GetBucket() {
		for _, l := range b.GetExemplar().GetLabel() {
			if l.GetName() == "trace_id" && l.GetValue() == tidA {
				found = true
			}
		}
	}
	if m.GetHistogram().GetSampleCount() != 2 || !found {
		t.Errorf("dwell of orders: %d samples, exemplar with trace %s found %v", m.GetHistogram().GetSampleCount(), tidA, found)
	}
}
