package cli_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// collector keeps the spans an OTLP receiver was sent, with their
// resources' service names.
type collector struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	services map[string]bool
}

func (c *collector) add(req *coltracepb.ExportTraceServiceRequest) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.services == nil {
		c.services = map[string]bool{}
	}
	for _, rs := range req.GetResourceSpans() {
		if v, ok := attr(rs.GetResource().GetAttributes(), "service.name"); ok {
			c.services[v.GetStringValue()] = true
		}
		for _, ss := range rs.GetScopeSpans() {
			c.spans = append(c.spans, ss.GetSpans()...)
		}
	}
}

// inTrace returns the spans received so far in the trace tid.
func (c *collector) inTrace(tid []byte) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if string(s.GetTraceId()) == string(tid) {
			out = append(out, s)
		}
	}
	return out
}

// linking returns the spans received so far with a link into trace tid.
func (c *collector) linking(tid []byte) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		for _, l := range s.GetLinks() {
			if string(l.GetTraceId()) == string(tid) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

func attr(kvs []*commonpb.KeyValue, key string) (*commonpb.AnyValue, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue(), true
		}
	}
	return nil, false
}

// otlpHTTP is an OTLP/HTTP receiver (binary protobuf) feeding c.
func otlpHTTP(t *testing.T, c *collector) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP trace export", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(body, req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		c.add(req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// grpcReceiver is an OTLP/gRPC receiver feeding c.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	c *collector
}

func (g grpcReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.c.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func otlpGRPC(t *testing.T, c *collector) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(s, grpcReceiver{c: c})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return "http://" + lis.Addr().String()
}

// TestTracingExportsSpans is issue 47's tracing acceptance: with
// OTEL_EXPORTER_OTLP_ENDPOINT set (OTLP over HTTP, and over gRPC with
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc), an event written with a traceparent
// is published with that header unchanged, and the relay exports a
// producer span in the event's trace, child of the writer's span, with
// the messaging attributes of the record it became (topic, partition,
// offset, event id), plus a batch span linking to it; the dwell
// histogram carries the trace id as an OpenMetrics exemplar.
func TestTracingExportsSpans(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) {
			t.Parallel()
			c := &collector{}
			endpoint := otlpHTTP(t, c)
			if protocol == "grpc" {
				endpoint = otlpGRPC(t, c)
			}
			url, bin := e2e.Migrated(t)
			const (
				traceID  = "4bf92f3577b34da6a3ce929d0e0e4736"
				parentID = "00f067aa0ba902b7"
			)
			traceparent := "00-" + traceID + "-" + parentID + "-01"
			conn := pgtest.Connect(t, url)
			ctx := context.Background()
			var eventID string
			if err := conn.QueryRow(ctx, `SELECT outbox.emit('orders', 'k1', 'paid'::text, $1::jsonb)::text`,
				fmt.Sprintf(`{"traceparent":%q,"tracestate":"vendor=opaque"}`, traceparent)).Scan(&eventID); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SELECT outbox.emit('orders', 'k2', 'untraced'::text)`); err != nil {
				t.Fatal(err)
			}
			httpAddr, kafkaAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
			p := e2e.Start(t, bin, []string{
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
				"OTEL_EXPORTER_OTLP_PROTOCOL=" + protocol,
				"OTEL_SERVICE_NAME=relay-under-test",
				"OTEL_BSP_SCHEDULE_DELAY=100",
			}, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", httpAddr,
				"--kafka-addr", kafkaAddr, "--partitions", "3")
			e2e.WaitDrained(t, url, "outbox", time.Minute)

			records := kafkatest.ReadRecords(t, []string{kafkaAddr}, "orders", false)
			var partition int32 = -1
			var offset int64
			for _, r := range records {
				if string(r.Key) != "k1" {
					continue
				}
				partition, offset = r.Partition, r.Offset
				for _, h := range r.Headers {
					if h.Key == "traceparent" && string(h.Value) != traceparent {
						t.Fatalf("the record's traceparent is %q, the row's %q", h.Value, traceparent)
					}
				}
			}
			if partition < 0 {
				t.Fatalf("no record of key k1 in %d records", len(records))
			}

			tid, _ := hex.DecodeString(traceID)
			pid, _ := hex.DecodeString(parentID)
			var span *tracepb.Span
			eventually(t, time.Minute, "the relay's span in the event's trace", func() error {
				spans := c.inTrace(tid)
				if len(spans) == 0 {
					return fmt.Errorf("no span in trace %s yet", traceID)
				}
				span = spans[0]
				return nil
			})
			if string(span.GetParentSpanId()) != string(pid) {
				t.Errorf("span %q has parent %x, want the writer's span %s", span.GetName(), span.GetParentSpanId(), parentID)
			}
			if span.GetKind() != tracepb.Span_SPAN_KIND_PRODUCER || span.GetName() != "send orders" {
				t.Errorf("span %q of kind %v, want producer span \"send orders\"", span.GetName(), span.GetKind())
			}
			if span.GetTraceState() != "vendor=opaque" {
				t.Errorf("span tracestate %q, want the row's", span.GetTraceState())
			}
			want := map[string]string{
				"messaging.system":                   "kafka",
				"messaging.operation.type":           "send",
				"messaging.destination.name":         "orders",
				"messaging.message.id":               eventID,
				"messaging.destination.partition.id": strconv.Itoa(int(partition)),
				"messaging.kafka.offset":             strconv.FormatInt(offset, 10),
			}
			for k, v := range want {
				got, ok := attr(span.GetAttributes(), k)
				s := ""
				if ok {
					s = got.GetStringValue()
					if _, isInt := got.GetValue().(*commonpb.AnyValue_IntValue); isInt {
						s = strconv.FormatInt(got.GetIntValue(), 10)
					}
				}
				if s != v {
					t.Errorf("span attribute %s = %q, want %q", k, s, v)
				}
			}
			if span.GetEndTimeUnixNano() <= span.GetStartTimeUnixNano() {
				t.Errorf("span from %d to %d", span.GetStartTimeUnixNano(), span.GetEndTimeUnixNano())
			}
			eventually(t, time.Minute, "the batch span linking to the event's trace", func() error {
				batches := c.linking(tid)
				if len(batches) == 0 {
					return fmt.Errorf("no span links to trace %s yet", traceID)
				}
				if n, _ := attr(batches[0].GetAttributes(), "messaging.batch.message_count"); n.GetIntValue() < 1 {
					return fmt.Errorf("batch span %q without a message count", batches[0].GetName())
				}
				return nil
			})
			c.mu.Lock()
			services := c.services
			c.mu.Unlock()
			if !services["relay-under-test"] {
				t.Errorf("resources' service names %v, want OTEL_SERVICE_NAME's", services)
			}

			req, _ := http.NewRequest("GET", "http://"+httpAddr+"/metrics", nil)
			req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), `trace_id="`+traceID+`"`) || !strings.Contains(string(body), `relay_dwell_seconds_bucket{topic="orders"`) {
				t.Errorf("/metrics (OpenMetrics) has no dwell exemplar with trace id %s:\n%s", traceID, grepLines(string(body), "relay_dwell_seconds"))
			}
			p.Stop(30 * time.Second)
		})
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestTracingNeverHoldsPublication: the fault model of internal/tracing.
// With a collector that takes the export requests and never answers, and
// with one that refuses connections, events are published all the same:
// the second round is published while the stuck collector holds an export,
// and the relay exits cleanly on SIGTERM (the flush at exit is bounded).
func TestTracingNeverHoldsPublication(t *testing.T) {
	t.Parallel()
	for _, stuck := range []bool{true, false} {
		t.Run(map[bool]string{true: "collector_never_answers", false: "collector_refuses"}[stuck], func(t *testing.T) {
			t.Parallel()
			endpoint := "http://" + e2e.FreeAddr(t) // nothing listens there
			arrived := make(chan struct{}, 1)
			if stuck {
				release := make(chan struct{})
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					select {
					case arrived <- struct{}{}:
					default:
					}
					<-release
				}))
				t.Cleanup(srv.Close)
				t.Cleanup(func() { close(release) })
				endpoint = srv.URL
			}
			url, bin := e2e.Migrated(t)
			conn := pgtest.Connect(t, url)
			emit := func(round int) {
				t.Helper()
				for i := range 50 {
					tp := fmt.Sprintf("00-%032x-%016x-01", round*1000+i+1, i+1)
					if _, err := conn.Exec(context.Background(), `SELECT outbox.emit('orders', $1, 'v'::text, $2::jsonb)`,
						fmt.Sprint(i), fmt.Sprintf(`{"traceparent":%q}`, tp)); err != nil {
						t.Fatal(err)
					}
				}
			}
			emit(1)
			p := e2e.Start(t, bin, []string{
				"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
				"OTEL_EXPORTER_OTLP_TIMEOUT=600000",
				"OTEL_BSP_SCHEDULE_DELAY=50",
			}, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", e2e.FreeAddr(t), "--kafka-addr", "")
			e2e.WaitDrained(t, url, "outbox", time.Minute)
			if stuck {
				select {
				case <-arrived:
				case <-time.After(time.Minute):
					t.Fatal("the relay sent the collector no export")
				}
			}
			emit(2)
			e2e.WaitDrained(t, url, "outbox", time.Minute)
			p.Stop(30 * time.Second)
		})
	}
}

// TestTracingConfigErrors: an OTEL_* value the relay cannot honour stops
// `relay run` with one line naming the variable.
func TestTracingConfigErrors(t *testing.T) {
	t.Parallel()
	for _, env := range [][]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL=thrift"},
		{"OTEL_TRACES_EXPORTER=zipkin"},
		{"OTEL_TRACES_EXPORTER=otlp", "OTEL_PROPAGATORS=b3"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT=http://user:hunter2@[::1"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector:4317"},
	} {
		r := relay(t, env, "run", "--database-url", "postgres://u@127.0.0.1:1/x", "--data-dir", t.TempDir(), "--http-addr", "", "--kafka-addr", "")
		name := strings.SplitN(env[len(env)-1], "=", 2)[0]
		if r.Code == 0 || !strings.Contains(r.Stderr, name) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Errorf("relay run with %v: exit %d, stderr %q; want a non-zero exit and one line naming %s", env, r.Code, r.Stderr, name)
		}
		if strings.Contains(r.Stdout+r.Stderr, "hunter2") {
			t.Errorf("relay run with %v printed the endpoint's password: %s %s", env, r.Stdout, r.Stderr)
		}
	}
}
