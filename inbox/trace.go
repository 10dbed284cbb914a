package inbox

import (
	"context"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const tracerName = "github.com/outboxrelay/relay/inbox"

// headerCarrier reads a record's headers as a propagation carrier.
type headerCarrier []kgo.RecordHeader

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

// startSpan continues the trace of r's traceparent header with a consumer
// span, through the global propagator and tracer provider: without an
// OpenTelemetry SDK configured both are no-ops.
func (c *Consumer) startSpan(ctx context.Context, r *kgo.Record, id string) (context.Context, func(error)) {
	ctx = otel.GetTextMapPropagator().Extract(ctx, headerCarrier(r.Headers))
	ctx, span := otel.Tracer(tracerName).Start(ctx, "process "+r.Topic,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", r.Topic),
			attribute.String("messaging.destination.partition.id", strconv.Itoa(int(r.Partition))),
			attribute.Int64("messaging.kafka.offset", r.Offset),
			attribute.String("messaging.consumer.group.name", c.cfg.Group),
			attribute.String("messaging.message.id", id),
		))
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
