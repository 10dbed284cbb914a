package cli

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/outboxrelay/relay/internal/tracing"
)

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/outboxrelay/relay"

// traceFlushTimeout bounds the flush of queued spans at exit, so a
// collector that is down delays the exit by at most this.
const traceFlushTimeout = 5 * time.Second

// relayTracing is the process's tracer provider; nil when off.
type relayTracing struct{ *tracing.Provider }

// startTracing configures tracing from the OTEL_* variables (see
// docs/tracing.md): off unless an OTLP endpoint or exporter is set.
func startTracing(log *slog.Logger) (relayTracing, error) {
	p, s, err := tracing.FromEnv(os.Getenv, log)
	if err != nil {
		return relayTracing{}, err
	}
	if p != nil {
		log.Info("tracing on: exporting spans over OTLP", "protocol", s.Protocol, "endpoint", s.Endpoint)
	}
	return relayTracing{p}, nil
}

// stop flushes the spans still queued, within traceFlushTimeout.
func (t relayTracing) stop(log *slog.Logger) {
	if t.Provider == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans not flushed at exit", "err", err)
	}
}
