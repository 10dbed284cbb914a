package bench

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// With Config.Tracing every event is written with a traceparent header,
// and each run is measured twice in the same environment: first with
// tracing off, then with the relay exporting its spans over OTLP/HTTP to
// a receiver in the bench that reads and discards them (otlpSink). The
// two Results differ in Mode ("... tracing off", "... tracing on").

// otlpSink is an OTLP/HTTP receiver that takes every export and keeps
// only how many requests and bytes it got.
type otlpSink struct {
	srv            *http.Server
	addr           string
	requests, size atomic.Int64
}

func startOTLPSink() (*otlpSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &otlpSink{addr: ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		s.size.Add(n)
		// An empty ExportTraceServiceResponse encodes as no bytes.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			ln.Close()
		}
	}()
	return s, nil
}

// env is what the relay's environment gets to export to the sink.
func (s *otlpSink) env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + s.addr, "OTEL_SERVICE_NAME=relay-bench"}
}

func (s *otlpSink) close() { s.srv.Shutdown(context.Background()) }

// tracingRuns measures one run with tracing off, then on.
func (e *env) tracingRuns(ctx context.Context) ([]Result, error) {
	measure := func() (Result, error) {
		if e.cfg.Backlog {
			return e.backlog(ctx)
		}
		return e.live(ctx)
	}
	var out []Result
	for _, on := range []bool{false, true} {
		e.relayEnv = nil
		label := " tracing off"
		var sink *otlpSink
		if on {
			var err error
			if sink, err = startOTLPSink(); err != nil {
				return out, err
			}
			defer sink.close()
			e.relayEnv = sink.env()
			label = " tracing on"
		}
		res, err := measure()
		res.Mode += label
		if sink != nil {
			// The relay stopped (and flushed its spans) in measure.
			res.OTLPExports, res.OTLPBytes = sink.requests.Load(), sink.size.Load()
		}
		out = append(out, res)
		if err != nil || res.Interrupted {
			return out, err
		}
	}
	e.relayEnv = nil
	return out, nil
}
