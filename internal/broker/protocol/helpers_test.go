package protocol

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/testlog"
)

type fixture struct {
	b    *broker.Broker
	srv  *Server
	addr string
	dir  string
}

// testLogger logs warnings and errors to the test output.
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t, slog.LevelWarn) }

// setup starts a broker in a temp dir and a Server on 127.0.0.1:0, both
// stopped in t.Cleanup. cfg may adjust the server's Config.
func setup(t testing.TB, cfg func(*Config)) *fixture {
	t.Helper()
	return setupBroker(t, broker.Options{}, cfg)
}

// serve runs srv on ln until the returned stop, which then closes srv
// and b too, reporting what fails.
func serve(t testing.TB, ctx context.Context, srv *Server, ln net.Listener, b *broker.Broker) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	return func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := srv.Close(); err != nil {
			t.Errorf("close server: %v", err)
		}
		if err := b.Close(); err != nil && !errors.Is(err, broker.ErrClosed) {
			t.Errorf("close broker: %v", err)
		}
	}
}

// setupConsumerGroups is setup for KIP-848 consumer groups: members
// heartbeat every 100 ms and are fenced after session.
func setupConsumerGroups(t testing.TB, session time.Duration) *fixture {
	return setup(t, func(c *Config) {
		c.ConsumerSessionTimeout = session
		c.ConsumerHeartbeatInterval = 100 * time.Millisecond
	})
}

// setupBroker is setup with broker options (Dir, JanitorInterval and
// Logger are set here).
func setupBroker(t testing.TB, opts broker.Options, cfg func(*Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	opts.Dir, opts.JanitorInterval, opts.Logger = t.TempDir(), -1, testLogger(t)
	b, err := broker.Open(ctx, opts)
	if err != nil {
		t.Fatalf("open broker: %v", err)
	}
	c := Config{
		MinSessionTimeout:     500 * time.Millisecond,
		InitialRebalanceDelay: 100 * time.Millisecond,
		AutoCreateTopics:      true,
		Logger:                testLogger(t),
	}
	if cfg != nil {
		cfg(&c)
	}
	srv, err := NewServer(b, c)
	if err != nil {
		t.Fatalf("new server: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(serve(t, ctx, srv, ln, b))
	return &fixture{b: b, srv: srv, addr: ln.Addr().String(), dir: opts.Dir}
}

// setupTopic is setup(t, nil) with topic created with parts partitions,
// and the test's context, which ends after timeout.
func setupTopic(t testing.TB, topic string, parts int32, timeout time.Duration) (*fixture, context.Context) {
	t.Helper()
	f := setup(t, nil)
	f.createTopic(t, topic, parts)
	return f, testContext(t, timeout)
}

func (f *fixture) createTopic(t testing.TB, name string, partitions int32) {
	t.Helper()
	if _, err := f.b.CreateTopic(name, broker.TopicConfig{Partitions: partitions}); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

func testContext(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func kcatPath(t testing.TB) string {
	t.Helper()
	const path = "/usr/bin/kcat"
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("kcat is required for the interop tests (apt-get install kcat): %v", err)
	}
	return path
}

// pythonWith is the path of Debian's python3, which the interop tests run
// their librdkafka clients with; it fails t unless python3 can import
// module (from python3-confluent-kafka).
func pythonWith(t testing.TB, module string) string {
	t.Helper()
	const path = "/usr/bin/python3"
	if out, err := exec.Command(path, "-c", "import "+module).CombinedOutput(); err != nil {
		t.Fatalf("python3-confluent-kafka is missing (apt-get install python3-confluent-kafka; .ci/run does): import %s: %v\n%s", module, err, out)
	}
	return path
}
