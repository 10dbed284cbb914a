package tracing_test

import (
	"context"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel"

	"github.com/outboxrelay/relay/internal/tracing"
)

// TestFromEnvOnlyWhenConfigured: tracing is off without an endpoint or
// exporter, and when disabled or set to none whatever else is set; on,
// it takes the protocol from the variables and installs the globals.
func TestFromEnvOnlyWhenConfigured(t *testing.T) {
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	const endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"
	for _, c := range []struct {
		env      map[string]string
		on       bool
		protocol string
	}{
		{env: nil},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}},
		{env: map[string]string{endpoint: "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}},
		{env: map[string]string{endpoint: "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{env: map[string]string{endpoint: "http://127.0.0.1:4318"}, on: true, protocol: "http/protobuf"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, on: true, protocol: "http/protobuf"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true, protocol: "grpc"},
		{env: map[string]string{endpoint: "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, on: true, protocol: "grpc"},
	} {
		p, s, err := tracing.FromEnv(func(k string) string { return c.env[k] }, slog.Default())
		if err != nil {
			t.Fatalf("%v: %v", c.env, err)
		}
		if on := p != nil; on != c.on || s.Protocol != c.protocol {
			t.Errorf("%v: on %v protocol %q, want on %v protocol %q", c.env, on, s.Protocol, c.on, c.protocol)
		}
		if p == nil {
			if p.Tracer("x") != nil {
				t.Errorf("%v: off, yet a tracer", c.env)
			}
			continue
		}
		if otel.GetTracerProvider() == prevTP || len(otel.GetTextMapPropagator().Fields()) == 0 {
			t.Errorf("%v: the global provider and propagator were not installed", c.env)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Errorf("%v: shutdown: %v", c.env, err)
		}
	}
}

// TestEndpointPasswordRedacted: the settings logged at startup never hold
// the endpoint's password.
func TestEndpointPasswordRedacted(t *testing.T) {
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() {
		otel.SetTracerProvider(prevTP)
		otel.SetTextMapPropagator(prevProp)
	})
	p, s, err := tracing.FromEnv(func(k string) string {
		if k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return "https://user:hunter2@collector:4318"
		}
		return ""
	}, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if s.Endpoint != "https://user:xxxxx@collector:4318" {
		t.Errorf("logged endpoint %q", s.Endpoint)
	}
}
