package cli_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// TestClientsSideBySide: against a relay with its default settings, 500
// connections held open from 127.0.0.1 are all served (no per-address
// limit, as in Kafka), and meanwhile clients of five ecosystems run side
// by side from the same host and read the relay's events: kcat
// (librdkafka), kafka-python, confluent-kafka-python and kafkajs, each in
// a consumer group of its own, franz-go (in a group, and kadm's
// max-timestamp ListOffsets, once refused) and sarama; and kafka-go and
// @platformatic/kafka each produce records to a topic of their own and
// read them back in a group (the one setting changed from the defaults is
// --listener-writable-topics, without which no client may produce).
// Meanwhile LinkedIn's Burrow, a consumer lag checker, reads the topic's
// end offsets (ListOffsets v0) and a group's commits from
// __consumer_offsets and reports each partition's committed offset and
// lag (burrowLagCheck). Nothing is refused and nothing is logged as
// refused.
func TestClientsSideBySide(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Fatal("python3 is required (apt-get install python3-kafka python3-confluent-kafka; .ci/run does)")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is required (apt-get install nodejs; .ci/run does)")
	}
	clients, _ := filepath.Abs("testdata/clients")
	resolve := exec.Command(node, "-e", "require.resolve('kafkajs')")
	resolve.Dir = clients
	if out, err := resolve.CombinedOutput(); err != nil {
		t.Fatalf("kafkajs is missing (npm ci --prefix internal/cli/testdata/clients; .ci/run does): %v\n%s", err, out)
	}
	kcat := kcatPath(t)
	burrow, err := exec.LookPath("Burrow")
	if err != nil {
		t.Fatal("Burrow is required (apt-get install burrow; .ci/run does)")
	}
	zkAddr, burrowDir := startZKStandIn(t), t.TempDir()

	url := pgtest.NewDatabase(t)
	if r := relay(t, nil, "migrate", "up", "--database-url", url); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	const events = 200
	conn := pgtest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for i := range events {
		if _, err := conn.Exec(ctx, `SELECT outbox.emit('side', $1, 'e', '{}'::jsonb)`, fmt.Sprint("k", i)); err != nil {
			t.Fatal(err)
		}
	}
	kafkaAddr, httpAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, testbin.Relay(t), nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t),
		"--http-addr", httpAddr, "--kafka-addr", kafkaAddr, "--listener-writable-topics", "side-w-")
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	// 500 connections from 127.0.0.1, each served an ApiVersions, held
	// open while the clients run.
	for i := range 500 {
		nc, err := net.Dial("tcp", kafkaAddr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		defer nc.Close()
		if err := apiVersionsRoundTrip(nc); err != nil {
			t.Fatalf("connection %d of 500 from 127.0.0.1 not served: %v", i, err)
		}
	}

	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	results := map[string]string{}
	took := map[string]time.Duration{}
	run := func(name string, fn func(context.Context) (string, error)) {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			began := time.Now()
			got, err := fn(cctx)
			if err != nil {
				got = "error: " + err.Error()
			}
			mu.Lock()
			results[name] = got
			took[name] = time.Since(began).Round(time.Millisecond)
			mu.Unlock()
		})
	}
	command := func(ctx context.Context, dir, bin string, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = dir
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("%v: %s", err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	}
	readJSON := func(out string) (string, error) {
		var r struct {
			Produced *int `json:"produced"`
			Read     int  `json:"read"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			return "", fmt.Errorf("printed %q: %v", out, err)
		}
		if r.Produced != nil {
			return fmt.Sprintf("produced %d, read %d", *r.Produced, r.Read), nil
		}
		return fmt.Sprintf("read %d", r.Read), nil
	}
	want := map[string]string{}
	for _, c := range []string{"kafka-python", "confluent-kafka"} {
		want[c] = fmt.Sprintf("read %d", events)
		run(c, func(ctx context.Context) (string, error) {
			out, err := command(ctx, clients, python, "side_by_side.py", c, kafkaAddr, "side", "side-"+c, fmt.Sprint(events))
			if err != nil {
				return "", err
			}
			return readJSON(out)
		})
	}
	want["kafkajs"] = fmt.Sprintf("read %d", events)
	run("kafkajs", func(ctx context.Context) (string, error) {
		out, err := command(ctx, clients, node, "side_by_side.js", kafkaAddr, "side", "side-kafkajs", fmt.Sprint(events))
		if err != nil {
			return "", err
		}
		return readJSON(out)
	})
	want["@platformatic/kafka"] = fmt.Sprintf("produced %d, read %d", events, events)
	run("@platformatic/kafka", func(ctx context.Context) (string, error) {
		out, err := command(ctx, clients, node, "side_by_side_platformatic.mjs", kafkaAddr, "side-w-platformatic", "side-platformatic", fmt.Sprint(events))
		if err != nil {
			return "", err
		}
		return readJSON(out)
	})
	want["kafka-go"] = fmt.Sprintf("produced %d, read %d", events, events)
	run("kafka-go", func(ctx context.Context) (string, error) {
		return kafkaGoProduceConsume(ctx, kafkaAddr, "side-w-kafka-go", "side-kafka-go", events)
	})
	want["kcat"] = fmt.Sprintf("read %d", events)
	run("kcat", func(ctx context.Context) (string, error) {
		out, err := command(ctx, clients, kcat, "-C", "-b", kafkaAddr, "-t", "side", "-o", "beginning", "-e", "-q", "-f", "%o\n")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("read %d", len(strings.Fields(out))), nil
	})
	want["franz-go"] = fmt.Sprintf("read %d, largest timestamp found", events)
	run("franz-go", func(ctx context.Context) (string, error) {
		cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ConsumerGroup("side-franz-go"), kgo.ConsumeTopics("side"),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
		if err != nil {
			return "", err
		}
		defer cl.Close()
		n := 0
		for n < events {
			fs := cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return fmt.Sprintf("read %d", n), err
			}
			if errs := fs.Errors(); len(errs) > 0 {
				return "", errs[0].Err
			}
			n += fs.NumRecords()
		}
		listed, err := kadm.NewClient(cl).ListMaxTimestampOffsets(ctx, "side")
		if err != nil {
			return "", err
		}
		found := false
		listed.Each(func(o kadm.ListedOffset) { found = found || (o.Err == nil && o.Offset >= 0 && o.Timestamp > 0) })
		if err := listed.Error(); err != nil || !found {
			return "", fmt.Errorf("max timestamp: %v, found %v", err, found)
		}
		return fmt.Sprintf("read %d, largest timestamp found", n), nil
	})
	want["sarama"] = fmt.Sprintf("read %d", events)
	run("sarama", func(ctx context.Context) (string, error) {
		cfg := sarama.NewConfig()
		cfg.Version = sarama.V2_8_0_0
		cons, err := sarama.NewConsumer([]string{kafkaAddr}, cfg)
		if err != nil {
			return "", err
		}
		defer cons.Close()
		parts, err := cons.Partitions("side")
		if err != nil {
			return "", err
		}
		n := 0
		for _, part := range parts {
			pc, err := cons.ConsumePartition("side", part, sarama.OffsetOldest)
			if err != nil {
				return "", err
			}
			hw := pc.HighWaterMarkOffset()
			for read := int64(0); read < hw; read++ {
				select {
				case <-pc.Messages():
					n++
				case err := <-pc.Errors():
					pc.Close()
					return "", err
				case <-ctx.Done():
					pc.Close()
					return fmt.Sprintf("read %d", n), ctx.Err()
				}
			}
			pc.Close()
		}
		return fmt.Sprintf("read %d", n), nil
	})
	want["burrow"] = "group side-burrow: every partition's committed offset and lag"
	run("burrow", func(ctx context.Context) (string, error) {
		return burrowLagCheck(ctx, burrow, burrowDir, zkAddr, kafkaAddr, e2e.FreeAddr(t), "side", "side-burrow")
	})
	wg.Wait()
	t.Logf("eight clients and Burrow side by side, 500 idle connections held: %v (%v)", time.Since(start).Round(time.Millisecond), took)
	for name, w := range want {
		if results[name] != w {
			t.Errorf("%s: %s; want %s", name, results[name], w)
		}
	}
	if n := e2e.Metric(t, httpAddr, `relay_listener_connections_refused_total{limit="per_address"}`) +
		e2e.Metric(t, httpAddr, `relay_listener_connections_refused_total{limit="total"}`); n != 0 {
		t.Errorf("%v connections refused", n)
	}
	if out := p.Output(); strings.Contains(out, "connection refused: connection limit reached") {
		t.Errorf("the relay logged refused connections:\n%s", out)
	}
}

// kafkaGoProduceConsume writes n keyed records to topic with
// segmentio/kafka-go's Writer (the topic is created on first use) and
// reads them back with its Reader in group.
func kafkaGoProduceConsume(ctx context.Context, addr, topic, group string, n int) (string, error) {
	w := &kafkago.Writer{Addr: kafkago.TCP(addr), Topic: topic, Balancer: &kafkago.Hash{},
		RequiredAcks: kafkago.RequireAll, AllowAutoTopicCreation: true, BatchTimeout: 10 * time.Millisecond}
	msgs := make([]kafkago.Message, n)
	for i := range msgs {
		msgs[i] = kafkago.Message{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("v", i))}
	}
	err := w.WriteMessages(ctx, msgs...)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: []string{addr}, GroupID: group, Topic: topic,
		StartOffset: kafkago.FirstOffset, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	read := 0
	for read < n {
		if _, err := r.FetchMessage(ctx); err != nil {
			return "", fmt.Errorf("read %d: %w", read, err)
		}
		read++
	}
	return fmt.Sprintf("produced %d, read %d", n, read), nil
}

// apiVersionsRoundTrip sends an ApiVersions v0 request on nc and reads its
// response.
func apiVersionsRoundTrip(nc net.Conn) error {
	frame := kafkaFrame(1, kmsg.NewPtrApiVersionsRequest())
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(frame); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(nc, size[:]); err != nil {
		return err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	_, err := io.ReadFull(nc, body)
	return err
}
