package outbox_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/relay/outbox"
)

// TestEmitCarriesTraceContext: Emit writes the context's span and baggage
// as W3C headers through the global propagator, keeps headers the caller
// set, and adds nothing without a propagator.
func TestEmitCarriesTraceContext(t *testing.T) {
	prev := otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTextMapPropagator(prev) })
	writer, observer := setup(t, "outbox")
	ctx := context.Background()

	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=opaque")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	spanCtx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(ctx, sc), bag)

	emit := func(events ...outbox.Event) []row {
		t.Helper()
		tx, err := writer.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := outbox.Emit(spanCtx, tx, events...)
		if err != nil {
			t.Fatal(err)
		}
		end(t, tx, true)
		rows := make([]row, len(ids))
		for i, id := range ids {
			rows[i], _ = readEvent(t, observer, "outbox", id)
		}
		return rows
	}

	// OpenTelemetry's default propagator is a no-op: nothing is added.
	rows := emit(outbox.Event{Topic: "orders", Payload: []byte("a")})
	if rows[0].headers != nil {
		t.Fatalf("without a propagator the headers are %v, want none", rows[0].headers)
	}

	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	mine := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "kind": "paid"}
	rows = emit(
		outbox.Event{Topic: "orders", Payload: []byte("b")},
		outbox.Event{Topic: "orders", Payload: []byte("c"), Headers: mine},
	)
	want := map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "vendor=opaque",
		"baggage":     "tenant=acme",
	}
	for k, v := range want {
		if rows[0].headers[k] != v {
			t.Errorf("header %s = %q, want %q (headers %v)", k, rows[0].headers[k], v, rows[0].headers)
		}
	}
	if got := rows[1].headers["traceparent"]; got != mine["traceparent"] {
		t.Errorf("the caller's traceparent became %q", got)
	}
	if rows[1].headers["kind"] != "paid" || rows[1].headers["baggage"] != "tenant=acme" {
		t.Errorf("headers %v: want the caller's kind and the context's baggage", rows[1].headers)
	}
	if len(mine) != 2 {
		t.Errorf("Emit changed the caller's map: %v", mine)
	}
}
