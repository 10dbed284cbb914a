package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testlog"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// testLogger logs warnings and errors to the test output.
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t, slog.LevelWarn) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// eachMode runs test, in parallel with the other tests, as one parallel
// subtest per mode of the sink: idempotent (txn false) and transactional.
func eachMode(t *testing.T, test func(t *testing.T, txn bool)) {
	t.Parallel()
	for _, txn := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactional=%v", txn), func(t *testing.T) {
			t.Parallel()
			test(t, txn)
		})
	}
}

// newSink returns a sink on brokers that creates topics with 3 partitions;
// adjust changes the config first.
func newSink(t testing.TB, brokers []string, adjust func(*kafka.Config)) *kafka.Sink {
	t.Helper()
	cfg := kafka.Config{
		Brokers:        brokers,
		CreateTopics:   true,
		Partitions:     3,
		PublishTimeout: 20 * time.Second,
		Logger:         testLogger(t),
	}
	if adjust != nil {
		adjust(&cfg)
	}
	s, err := kafka.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func transactional(id string) func(*kafka.Config) {
	return func(c *kafka.Config) { c.TransactionalID = id }
}

func TestSinkConformanceKfake(t *testing.T) {
	relaytest.RunSinkTests(t, func(t *testing.T) relaytest.SinkHarness {
		c := kafkatest.Start(t)
		return relaytest.SinkHarness{
			New:        func(t *testing.T) relay.Sink { return newSink(t, c.Addrs(), nil) },
			Read:       func(t *testing.T, topic string) []relaytest.Record { return kafkatest.Read(t, c.Addrs(), topic, false) },
			Partitions: 3,
		}
	})
}

func TestSinkConformanceKfakeExactlyOnce(t *testing.T) {
	relaytest.RunSinkTests(t, func(t *testing.T) relaytest.SinkHarness {
		c := kafkatest.Start(t)
		return relaytest.SinkHarness{
			New:         func(t *testing.T) relay.Sink { return newSink(t, c.Addrs(), transactional("relay-test")) },
			Read:        func(t *testing.T, topic string) []relaytest.Record { return kafkatest.Read(t, c.Addrs(), topic, true) },
			Partitions:  3,
			ExactlyOnce: true,
		}
	})
}

// startEmbedded serves a fresh embedded broker over the Kafka protocol on
// 127.0.0.1 and returns its address.
func startEmbedded(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	b, err := broker.Open(ctx, broker.Options{Dir: t.TempDir(), JanitorInterval: -1, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := protocol.NewServer(b, protocol.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-served
		srv.Close()
		if err := b.Close(); err != nil && !errors.Is(err, broker.ErrClosed) {
			t.Errorf("close broker: %v", err)
		}
	})
	return ln.Addr().String()
}

func TestSinkConformanceEmbeddedBroker(t *testing.T) {
	relaytest.RunSinkTests(t, func(t *testing.T) relaytest.SinkHarness {
		addr := startEmbedded(t)
		return relaytest.SinkHarness{
			New: func(t *testing.T) relay.Sink { return newSink(t, []string{addr}, nil) },
			Read: func(t *testing.T, topic string) []relaytest.Record {
				return kafkatest.Read(t, []string{addr}, topic, false)
			},
			Partitions: 3,
		}
	})
}
