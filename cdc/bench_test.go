package cdc_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/relay"
)

// BenchmarkStreamBacklog measures how fast the source drains a backlog of
// b.N events (200-byte payloads, 1,000-event transactions) waiting in its
// slot, acknowledging every batch as the core would (without the sink and
// the row deletion).
func BenchmarkStreamBacklog(b *testing.B) {
	f := setup(b)
	f.cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	src, err := cdc.New(f.cfg)
	if err != nil {
		b.Fatal(err)
	}
	// Create the slot, then write the backlog while nothing streams.
	if err := src.Start(ctx, relay.Position{}); err != nil {
		b.Fatal(err)
	}
	src.Close(ctx)
	for done := 0; done < b.N; done += 1000 {
		n := min(1000, b.N-done)
		if _, err := f.conn.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) SELECT 't', 'k' || (g % 1000), convert_to(repeat('x', 200), 'UTF8') FROM generate_series(1, $1) AS g", n); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	began := time.Now()
	if err := src.Start(ctx, relay.Position{}); err != nil {
		b.Fatal(err)
	}
	defer src.Close(ctx)
	for got := 0; got < b.N; {
		events, err := src.Next(ctx, 1000)
		if err != nil {
			b.Fatal(err)
		}
		got += len(events)
		if err := src.Acked(ctx, events[len(events)-1].Position); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "events/s")
}
