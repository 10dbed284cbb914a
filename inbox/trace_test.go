package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/inbox"
)

// TestInboxContinuesTrace: with an OpenTelemetry SDK configured, the
// handler runs in a consumer span of the record's traceparent trace, its
// parent the span that wrote the event, and the handler's context carries
// it.
func TestInboxContinuesTrace(t *testing.T) {
	// Not parallel: it sets the global tracer provider and propagator.
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())

	f := setup(t)
	f.createTopic("traced", 1)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r := &kgo.Record{Topic: "traced", Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: inbox.EventIDHeader, Value: []byte("traced-1")}, {Key: "traceparent", Value: []byte(traceparent)}}}
	if err := f.cl.ProduceSync(f.ctx, r).FirstErr(); err != nil {
		t.Fatal(err)
	}
	handlerTrace := make(chan trace.SpanContext, 1)
	c := f.consumer(inbox.Config{Group: "traced", Topics: []string{"traced"}, Handler: func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		select {
		case handlerTrace <- trace.SpanContextFromContext(ctx):
		default:
		}
		return nil
	}})
	stop := f.run(c)
	var sc trace.SpanContext
	select {
	case sc = <-handlerTrace:
	case <-time.After(time.Minute):
		t.Fatal("the handler never ran")
	}
	stop()
	if got := sc.TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("handler's trace id %s, want the record's", got)
	}
	var found bool
	for _, s := range rec.Ended() {
		if s.Name() == "process traced" {
			found = true
			if s.Parent().SpanID().String() != "00f067aa0ba902b7" || s.SpanKind() != trace.SpanKindConsumer {
				t.Errorf("span parent %s kind %v", s.Parent().SpanID(), s.SpanKind())
			}
		}
	}
	if !found {
		t.Fatalf("no process span among %d ended spans", len(rec.Ended()))
	}
}
