package relay

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (Config.Tracer set; internal/tracing configures it from the
// OTEL_* variables) follows the OpenTelemetry messaging semantic
// conventions. Once a batch is durable, traceBatch records:
//
//   - for each event whose row headers carry a trace context (traceparent,
//     tracestate, baggage, read through the global propagator), a producer
//     span "send <topic>" in that trace, child of the writer's span, from
//     the event's commit (cdc) or creation (poll) to the durable
//     acknowledgement, with the event id, topic, partition and offset;
//   - one producer span "send" for the batch, from its hand-over to the
//     sink to the acknowledgement, with the batch size and a link to each
//     event's trace context.
//
// Spans are made after the fact, with explicit timestamps, on the
// goroutine that waits for durability: nothing is added before the sink.
// Without a tracer none of this runs (a nil check), and the sink is not
// asked for placements. Tracing never fails or delays a batch beyond the
// span's creation: see internal/tracing's fault model.

// headerCarrier reads a message's headers as a propagation carrier.
type headerCarrier []Header

func (h headerCarrier) Get(key string) string {
	for _, x := range h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}

func (h headerCarrier) Set(string, string) {}

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i, x := range h {
		keys[i] = x.Key
	}
	return keys
}

var _ propagation.TextMapCarrier = headerCarrier(nil)

// traceBatch records the spans of a durable batch (see above) and returns
// each message's span context: the event's span, or invalid for an event
// without a trace context.
func (r *Relay) traceBatch(f flight, res PublishResult) []trace.SpanContext {
	now := time.Now()
	tracer, prop := r.cfg.Tracer, otel.GetTextMapPropagator()
	traced := make([]trace.SpanContext, len(f.msgs))
	links := make([]trace.Link, 0, len(f.msgs))
	topic := ""
	for i, m := range f.msgs {
		switch {
		case i == 0:
			topic = m.Topic
		case topic != m.Topic:
			topic = ""
		}
		if !hasTraceparent(m.Headers) {
			continue
		}
		ctx := prop.Extract(context.Background(), headerCarrier(m.Headers))
		parent := trace.SpanContextFromContext(ctx)
		if !parent.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: parent})
		e := f.routed[i]
		start := e.CreatedAt
		if !e.CommittedAt.IsZero() {
			start = e.CommittedAt
		}
		attrs := []attribute.KeyValue{
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.destination.name", m.Topic),
			attribute.String("messaging.message.id", e.EventID),
		}
		if i < len(res.Placements) && res.Placements[i].Partition >= 0 {
			attrs = append(attrs, attribute.String("messaging.destination.partition.id", strconv.Itoa(int(res.Placements[i].Partition))))
			if o := res.Placements[i].Offset; o >= 0 {
				attrs = append(attrs, attribute.Int64("messaging.kafka.offset", o))
			}
		}
		_, span := tracer.Start(ctx, "send "+m.Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithTimestamp(start),
			trace.WithAttributes(attrs...))
		if err, failed := res.Failed[i]; failed {
			span.SetStatus(codes.Error, err.Error())
		}
		traced[i] = span.SpanContext()
		span.End(trace.WithTimestamp(now))
	}
	name := "send"
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", "kafka"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.operation.name", "send"),
		attribute.Int("messaging.batch.message_count", len(f.msgs)),
	}
	if topic != "" {
		name += " " + topic
		attrs = append(attrs, attribute.String("messaging.destination.name", topic))
	}
	_, span := tracer.Start(context.Background(), name,
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(f.sent),
		trace.WithLinks(links...),
		trace.WithAttributes(attrs...))
	if n := len(res.Failed); n > 0 {
		span.SetAttributes(attribute.Int("relay.failed_message_count", n))
	}
	span.End(trace.WithTimestamp(now))
	return traced
}

// hasTraceparent is a cheap test before the propagator's extraction.
func hasTraceparent(hs []Header) bool {
	for _, h := range hs {
		if h.Key == "traceparent" {
			return true
		}
	}
	return false
}

// observeDwell records one event's dwell in its topic's histogram, with
// its trace id as exemplar when sc is valid.
func (r *Relay) observeDwell(topic string, d time.Duration, sc trace.SpanContext) {
	o, ok := r.dwell[topic]
	if !ok {
		if r.dwell == nil {
			r.dwell = map[string]prometheus.Observer{}
		}
		o = r.m.Dwell.WithLabelValues(topic)
		r.dwell[topic] = o
	}
	if sc.IsValid() && sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
			return
		}
	}
	o.Observe(d.Seconds())
}
