// Package tracing configures the OpenTelemetry SDK for the relay from the
// standard OTEL_* environment variables.
//
// Tracing is off unless an OTLP endpoint or exporter is configured:
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set, or
// OTEL_TRACES_EXPORTER=otlp. OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off whatever else is set. When off,
// FromEnv returns a nil *Provider and the relay does no tracing work at all
// (its hot path checks for a nil tracer).
//
// When on, the variables are read by the SDK and exporters themselves:
// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION,
// _CERTIFICATE and _INSECURE by the exporter; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES by the resource; OTEL_TRACES_SAMPLER(_ARG) and
// the OTEL_SPAN_*_LIMIT variables by the tracer provider; OTEL_BSP_* by
// the batch span processor. This package only reads what the Go SDK does
// not: OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER,
// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL (grpc picks the gRPC exporter;
// http/protobuf, the default, and http/json the HTTP one) and
// OTEL_PROPAGATORS (tracecontext and baggage, the default, or none).
//
// # Fault model
//
// Tracing never blocks or fails publication. Spans are ended on the
// relay's goroutines and handed to the SDK's batch span processor, whose
// queue (OTEL_BSP_MAX_QUEUE_SIZE) drops spans when full instead of
// blocking; exports run on the processor's own goroutine. An exporter that
// is unreachable, slow or refusing costs dropped spans and a warning in the
// log (at most one a minute, through ErrorHandler), never a stalled or
// failed batch: TestTracingNeverHoldsPublication (internal/cli) publishes
// through a relay binary whose collector refuses connections, and through
// one whose collector holds every export unanswered, and stops both with
// SIGTERM. Shutdown flushes what is queued, bounded by its context, so a
// collector that is down delays the relay's exit by at most that bound.
// A bad value (an unsupported exporter, protocol or propagator, an
// endpoint that is not an http(s) URL) is an error at startup naming the
// variable, never its value (TestTracingConfigErrors).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Provider is a configured tracer provider. A nil *Provider is tracing
// off: Tracer returns nil and Shutdown does nothing.
type Provider struct {
	tp *sdktrace.TracerProvider
}

// Settings is what FromEnv decided, for the startup log line: no secrets
// (headers are never read here, the endpoint's password is redacted).
type Settings struct {
	Protocol string
	Endpoint string
}

// FromEnv configures tracing from the environment as getenv reads it
// (os.Getenv in the binary). It returns nil when tracing is off, and an
// error naming the variable for a value it does not support. When on, it
// also installs the provider and the propagator as OpenTelemetry's
// globals, so other instrumentation in the process (the inbox package)
// uses them.
func FromEnv(getenv func(string) string, log *slog.Logger) (*Provider, Settings, error) {
	var s Settings
	if v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); strings.EqualFold(v, "true") {
		return nil, s, nil
	}
	on := getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "":
	case "none":
		return nil, s, nil
	case "otlp":
		on = true
	default:
		return nil, s, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: the relay exports traces with otlp (or none)", v)
	}
	if !on {
		return nil, s, nil
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if err := checkEndpoint(name, getenv(name)); err != nil {
			return nil, s, err
		}
	}
	prop, err := propagator(getenv("OTEL_PROPAGATORS"))
	if err != nil {
		return nil, s, err
	}
	s.Protocol = getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if s.Protocol == "" {
		s.Protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if s.Protocol == "" {
		s.Protocol = "http/protobuf"
	}
	s.Endpoint = redact(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
	if s.Endpoint == "" {
		s.Endpoint = redact(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	var exp sdktrace.SpanExporter
	// New only configures the client: neither exporter connects before
	// its first export.
	switch s.Protocol {
	case "http/protobuf", "http/json":
		exp, err = otlptracehttp.New(context.Background())
	case "grpc":
		exp, err = otlptracegrpc.New(context.Background())
	default:
		return nil, s, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: supported are http/protobuf, http/json and grpc", s.Protocol)
	}
	if err != nil {
		return nil, s, fmt.Errorf("configuring the OTLP trace exporter: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(prop)
	otel.SetErrorHandler(ErrorHandler(log, time.Minute))
	return &Provider{tp: tp}, s, nil
}

// propagator is OTEL_PROPAGATORS' propagator: a comma-separated list of
// tracecontext, baggage and none; empty is tracecontext,baggage.
func propagator(v string) (propagation.TextMapPropagator, error) {
	if strings.TrimSpace(v) == "" {
		v = "tracecontext,baggage"
	}
	var ps []propagation.TextMapPropagator
	for name := range strings.SplitSeq(v, ",") {
		switch strings.TrimSpace(name) {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none":
		default:
			return nil, fmt.Errorf("OTEL_PROPAGATORS: %q is not supported (tracecontext, baggage, none)", strings.TrimSpace(name))
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...), nil
}

// checkEndpoint refuses an endpoint that is not an http or https URL. The
// exporter would log it, password included, and fall back to its default;
// the error does not repeat the value.
func checkEndpoint(name, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s is not an http:// or https:// URL", name)
	}
	return nil
}

// redact returns endpoint with any password in it replaced.
func redact(endpoint string) string {
	if endpoint == "" {
		return ""
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable)"
	}
	return u.Redacted()
}

// Tracer returns the relay's tracer, nil when p is nil (tracing off).
func (p *Provider) Tracer(name string) trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tp.Tracer(name)
}

// Shutdown exports what is queued and stops the exporter, within ctx.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}

// ErrorHandler logs OpenTelemetry's errors (failed exports mostly) as
// warnings, at most one per interval, with how many were left out since
// the last one.
func ErrorHandler(log *slog.Logger, interval time.Duration) otel.ErrorHandler {
	h := &limitedHandler{log: log, interval: interval}
	return otel.ErrorHandlerFunc(h.handle)
}

type limitedHandler struct {
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (h *limitedHandler) handle(err error) {
	if err == nil || errors.Is(err, context.Canceled) {
		return
	}
	h.mu.Lock()
	now := time.Now()
	if !h.last.IsZero() && now.Sub(h.last) < h.interval {
		h.skipped++
		h.mu.Unlock()
		return
	}
	skipped := h.skipped
	h.last, h.skipped = now, 0
	h.mu.Unlock()
	h.log.Warn("tracing: spans not exported; publication goes on", "err", err, "errors_not_logged", skipped)
}
