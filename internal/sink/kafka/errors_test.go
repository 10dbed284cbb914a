package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

func start(t *testing.T, s relay.Sink, state []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx, relay.Session{State: state}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
}

func publish(t *testing.T, s relay.Sink, msgs []relay.Message) relay.PublishResult {
	t.Helper()
	res, err := s.Publish(context.Background(), msgs)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	return res
}

// wantRefused offers batch to s n times and fails the test unless each
// offer is refused whole with one relay.DestinationError for topic with
// reason, whose error names the topic and is cause (unless cause is nil).
func wantRefused(t *testing.T, s relay.Sink, batch []relay.Message, n int, topic, reason string, cause error) {
	t.Helper()
	for range n {
		_, err := s.Publish(context.Background(), batch)
		des := relay.DestinationErrors(err)
		if len(des) != 1 || des[0].Topic != topic || des[0].Reason != reason || cause != nil && !errors.Is(err, cause) {
			t.Fatalf("Publish with %s refused (%s): %v (destination errors %v)", topic, reason, err, des)
		}
		if !strings.Contains(err.Error(), topic) {
			t.Fatalf("the error does not name the topic: %v", err)
		}
	}
}

// wantAccepted publishes batch, which must be taken whole now that its
// topics can take it, and fails the test unless each topic of want then
// holds the values want lists, as read returns them.
func wantAccepted(t *testing.T, s relay.Sink, batch []relay.Message, read func(topic string) []string, want map[string]string) {
	t.Helper()
	if res := publish(t, s, batch); len(res.Failed) > 0 {
		t.Fatalf("Failed = %v once the topics could take the batch", res.Failed)
	}
	for topic, w := range want {
		if got := read(topic); fmt.Sprint(got) != w {
			t.Errorf("%s holds %v, want %s (each record once)", topic, got, w)
		}
	}
}

func msg(topic string, key, value []byte, id string) relay.Message {
	return relay.Message{Topic: topic, Key: key, Value: value, Timestamp: time.UnixMilli(1_760_000_000_000),
		Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte(id)}}}
}

// TestPartitionParity publishes 10,000 keys (and some keyless events)
// through the sink into kfake and checks each landed on the partition the
// embedded broker's partitioner picks.
func TestPartitionParity(t *testing.T) {
	t.Parallel()
	const parts = 7
	c := kafkatest.Start(t)
	s := newSink(t, c.Addrs(), func(c *kafka.Config) { c.Partitions = parts })
	start(t, s, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	var msgs []relay.Message
	for i := range 10_000 {
		key := fmt.Appendf(nil, "customer-%d", i)
		if i%3 == 0 { // arbitrary bytes of every tail length
			key = make([]byte, 1+rng.IntN(40))
			for j := range key {
				key[j] = byte(rng.Uint32())
			}
		}
		msgs = append(msgs, msg("parity", key, fmt.Appendf(nil, "v%d", i), fmt.Sprintf("id-%d", i)))
	}
	for i := range 300 {
		msgs = append(msgs, msg("parity", nil, fmt.Appendf(nil, "keyless%d", i), fmt.Sprintf("keyless-id-%d", i)))
	}
	for i := 0; i < len(msgs); i += 1000 {
		if res := publish(t, s, msgs[i:min(i+1000, len(msgs))]); len(res.Failed) > 0 {
			t.Fatalf("failed: %v", res.Failed)
		}
	}
	want := map[string]int32{}
	for _, m := range msgs {
		k := m.Key
		if k == nil {
			k = m.Headers[0].Value
		}
		want[string(m.Value)] = broker.PartitionForKey(k, parts)
	}
	records := kafkatest.Read(t, c.Addrs(), "parity", false)
	if len(records) != len(msgs) {
		t.Fatalf("read %d records, published %d", len(records), len(msgs))
	}
	used := map[int32]bool{}
	for _, r := range records {
		if w := want[string(r.Value)]; r.Partition != w {
			t.Fatalf("record %s (key %x) on partition %d, the embedded broker picks %d", r.Value, r.Key, r.Partition, w)
		}
		used[r.Partition] = true
	}
	if len(used) != parts {
		t.Fatalf("records used %d of %d partitions", len(used), parts)
	}
}

// TestRefusals: each message Kafka can never take is reported in Failed,
// and the others of its batch are published, in both modes. (A missing
// topic is not a refusal of its messages: TestMissingTopicWaits.)
func TestRefusals(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		c := kafkatest.Start(t)
		if err := c.Kfake().CreateTopic("small", 2, map[string]string{"max.message.bytes": "2000"}); err != nil {
			t.Fatal(err)
		}
		if err := c.Kfake().CreateTopic("compacted", 2, map[string]string{"cleanup.policy": "compact"}); err != nil {
			t.Fatal(err)
		}
		if err := c.Kfake().CreateTopic("present", 2, nil); err != nil {
			t.Fatal(err)
		}
		s := newSink(t, c.Addrs(), func(c *kafka.Config) {
			c.CreateTopics = false
			if txn {
				c.TransactionalID = "refusals"
			}
		})
		start(t, s, nil)
		big := bytes.Repeat([]byte("x"), 5000)
		msgs := []relay.Message{
			msg("small", []byte("k"), []byte("fits-1"), "1"),
			msg("small", []byte("k"), big, "2"),
			msg("bad topic!", []byte("k"), []byte("v"), "4"),
			msg("compacted", nil, []byte("keyless"), "5"),
			msg("compacted", []byte("k"), []byte("keyed"), "6"),
			msg("present", []byte("k"), bytes.Repeat([]byte("y"), 2<<20), "7"),
			msg("small", []byte("k"), []byte("fits-2"), "8"),
		}
		res := publish(t, s, msgs)
		wantErr := map[int]error{1: kafka.ErrRecordTooLarge, 2: kafka.ErrInvalidTopic,
			3: kafka.ErrKeylessCompacted, 5: kafka.ErrRecordTooLarge}
		for i, want := range wantErr {
			if !errors.Is(res.Failed[i], want) {
				t.Errorf("message %d: Failed = %v, want %v", i, res.Failed[i], want)
			}
		}
		if len(res.Failed) != len(wantErr) {
			t.Errorf("Failed = %v, want %d entries", res.Failed, len(wantErr))
		}
		got := values(kafkatest.Read(t, c.Addrs(), "small", txn))
		if fmt.Sprint(got) != "[fits-1 fits-2]" {
			t.Fatalf("small holds %v, want [fits-1 fits-2]", got)
		}
		if n := len(kafkatest.Read(t, c.Addrs(), "compacted", txn)); n != 1 {
			t.Fatalf("compacted holds %d records, want 1", n)
		}
	})
}

// TestMissingTopicWaits: a batch naming a topic the cluster does not have
// (and may not create) is refused whole with a relay.DestinationError
// naming it, nothing of it produced, and never cached: once the topic
// exists the same batch is published, each message once, in both modes.
func TestMissingTopicWaits(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		c := kafkatest.Start(t, kfake.SeedTopics(2, "present"))
		s := newSink(t, c.Addrs(), func(c *kafka.Config) {
			c.CreateTopics = false
			if txn {
				c.TransactionalID = "missing"
			}
		})
		start(t, s, nil)
		batch := []relay.Message{
			msg("present", []byte("k"), []byte("a1"), "1"),
			msg("absent", []byte("k"), []byte("b1"), "2"),
			msg("present", []byte("k"), []byte("a2"), "3"),
			msg("absent", []byte("j"), []byte("b2"), "4"),
		}
		wantRefused(t, s, batch, 3, "absent", relay.WaitTopicMissing, kafka.ErrTopicMissing)
		if n := len(kafkatest.Read(t, c.Addrs(), "present", false)); n != 0 {
			t.Fatalf("the refused batch left %d records in present", n)
		}
		if err := s.Ready(context.Background()); err != nil {
			t.Fatalf("the sink broke on a missing topic: %v", err)
		}
		if err := c.Kfake().CreateTopic("absent", 3, nil); err != nil {
			t.Fatal(err)
		}
		// The keys of absent's events may be on two partitions: their
		// order is not checked.
		sorted := func(topic string) []string {
			got := values(kafkatest.Read(t, c.Addrs(), topic, txn))
			slices.Sort(got)
			return got
		}
		wantAccepted(t, s, batch, sorted, map[string]string{"present": "[a1 a2]", "absent": "[b1 b2]"})
	})
}

// TestDeletedTopicWaits: a topic deleted under the relay (known to the
// sink, so found only when producing fails) refuses the batch with a
// relay.DestinationError, and is asked about again; what Kafka took of the
// batch (another topic's records) is not produced again, and once the
// topic is back the batch is published, each record once.
func TestDeletedTopicWaits(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t, kfake.SeedTopics(2, "orders", "other"))
	s := newSink(t, c.Addrs(), func(c *kafka.Config) { c.CreateTopics = false })
	start(t, s, nil)
	publish(t, s, []relay.Message{msg("orders", []byte("k"), []byte("o1"), "1")})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.DeleteTopics(context.Background(), "orders"); err != nil {
		t.Fatal(err)
	}
	batch := []relay.Message{
		msg("other", []byte("k"), []byte("x1"), "2"),
		msg("orders", []byte("k"), []byte("o2"), "3"),
		msg("other", []byte("k"), []byte("x2"), "4"),
	}
	wantRefused(t, s, batch, 2, "orders", relay.WaitTopicMissing, nil)
	if err := c.Kfake().CreateTopic("orders", 2, nil); err != nil {
		t.Fatal(err)
	}
	read := func(topic string) []string { return values(kafkatest.Read(t, c.Addrs(), topic, false)) }
	wantAccepted(t, s, batch, read, map[string]string{"other": "[x1 x2]", "orders": "[o2]"})
}

// TestTopicAuthorization: a topic the relay's SASL user may not write to
// refuses the batch with a relay.DestinationError; what Kafka took of the
// batch meanwhile is not produced again when it is offered anew, and once
// the ACL is granted the batch is published, each record once.
func TestTopicAuthorization(t *testing.T) {
	t.Parallel()
	topicACL := func(name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	c := kafkatest.Start(t,
		kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin-secret"),
		kfake.User("SCRAM-SHA-256", "relay", "relay-secret",
			kfake.ACL{Resource: kmsg.ACLResourceTypeCluster, Name: "kafka-cluster", Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationIdempotentWrite, Allow: true},
			topicACL("allowed", kmsg.ACLOperationWrite), topicACL("allowed", kmsg.ACLOperationDescribe),
			topicACL("denied", kmsg.ACLOperationDescribe),
		),
		kfake.SeedTopics(2, "allowed", "denied"),
	)
	s := newSink(t, c.Addrs(), func(c *kafka.Config) {
		c.CreateTopics = false
		c.SASL = kafka.SASLConfig{Mechanism: "scram-sha-256", User: "relay", Password: "relay-secret"}
	})
	start(t, s, nil)
	batch := []relay.Message{
		msg("allowed", []byte("a"), []byte("1"), "1"),
		msg("denied", []byte("a"), []byte("2"), "2"),
		msg("allowed", []byte("a"), []byte("3"), "3"),
	}
	wantRefused(t, s, batch, 2, "denied", relay.WaitUnauthorized, kerr.TopicAuthorizationFailed)

	admin, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...), kgo.SASL(plain.Auth{User: "admin", Pass: "admin-secret"}.AsMechanism()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	grant := kadm.NewACLs().Allow("User:relay").Topics("denied").Operations(kadm.OpWrite).ResourcePatternType(kadm.ACLPatternLiteral)
	if _, err := kadm.NewClient(admin).CreateACLs(context.Background(), grant); err != nil {
		t.Fatalf("granting Write on denied: %v", err)
	}
	read := func(topic string) []string {
		var got []string
		for _, r := range kafkatest.ReadRecords(t, c.Addrs(), topic, false, kgo.SASL(plain.Auth{User: "admin", Pass: "admin-secret"}.AsMechanism())) {
			got = append(got, string(r.Value))
		}
		return got
	}
	wantAccepted(t, s, batch, read, map[string]string{"allowed": "[1 3]", "denied": "[2]"})

	bad := newSink(t, c.Addrs(), func(c *kafka.Config) {
		c.SASL = kafka.SASLConfig{Mechanism: kafka.SASLScramSHA256, User: "relay", Password: "wrong-secret"}
		c.DialTimeout = 2 * time.Second
	})
	err = bad.Start(context.Background(), relay.Session{})
	if err == nil {
		bad.Close(context.Background())
		t.Fatal("Start with a wrong password succeeded")
	}
	if bytes.Contains([]byte(err.Error()), []byte("wrong-secret")) {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// TestUnreachable: with no broker answering, Start, Publish and Ready fail
// in bounded time.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	s := newSink(t, []string{dead}, func(c *kafka.Config) { c.DialTimeout = time.Second })
	began := time.Now()
	if err := s.Start(context.Background(), relay.Session{}); err == nil {
		t.Fatal("Start against a closed port succeeded")
	} else {
		t.Logf("Start: %v (after %v)", err, time.Since(began))
	}
	if time.Since(began) > 10*time.Second {
		t.Fatalf("Start took %v", time.Since(began))
	}

	// A cluster that goes away after Start.
	for _, txn := range []bool{false, true} {
		c := kafkatest.Start(t)
		s := newSink(t, c.Addrs(), func(cfg *kafka.Config) {
			// Long enough for the first publish, to a live cluster, on a
			// loaded machine under -race (2 s once was not).
			cfg.PublishTimeout = 5 * time.Second
			cfg.DialTimeout = time.Second
			if txn {
				cfg.TransactionalID = "unreachable"
			}
		})
		start(t, s, nil)
		publish(t, s, relaytest.Messages("orders", 0, 10, 3))
		c.Stop()
		began = time.Now()
		_, err := s.Publish(context.Background(), relaytest.Messages("orders", 10, 10, 3))
		if err == nil {
			t.Fatalf("transactional=%v: Publish with the cluster down succeeded", txn)
		}
		took := time.Since(began)
		t.Logf("transactional=%v: Publish: %v (after %v)", txn, err, took)
		if took > 20*time.Second {
			t.Fatalf("Publish took %v to fail (publish timeout 5s)", took)
		}
		began = time.Now()
		if err := s.Ready(context.Background()); err == nil {
			t.Fatal("Ready with the cluster down")
		}
		if took := time.Since(began); took > 20*time.Second {
			t.Fatalf("Ready took %v to fail", took)
		}
		s.Close(context.Background())
	}
}

// TestZombieFenced: once a relay with the same transactional id started,
// the earlier one can commit nothing more.
func TestZombieFenced(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	old := newSink(t, c.Addrs(), transactional("fence"))
	start(t, old, nil)
	saved := publish(t, old, relaytest.Messages("orders", 0, 10, 3)).State

	cur := newSink(t, c.Addrs(), transactional("fence"))
	start(t, cur, saved)
	if _, err := old.Publish(context.Background(), relaytest.Messages("orders", 10, 10, 3)); err == nil {
		t.Fatal("the fenced sink committed a transaction")
	} else {
		t.Logf("fenced: %v", err)
	}
	publish(t, cur, relaytest.Messages("orders", 10, 10, 3))
	old.Close(context.Background())
	cur.Close(context.Background())
	records := kafkatest.Read(t, c.Addrs(), "orders", true)
	seen := map[string]int{}
	for _, r := range records {
		seen[string(r.Value)]++
	}
	for i := range 20 {
		if n := seen[fmt.Sprintf("orders-%d", i)]; n != 1 {
			t.Fatalf("orders-%d read %d times", i, n)
		}
	}
}

// TestNotReadyWhileRecovering: in the exactly-once mode Start reads the
// progress markers after connecting; Ready fails until it has finished, so
// a relay is not reported ready while it recovers.
func TestNotReadyWhileRecovering(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	kf := c.Kfake()
	release := make(chan struct{})
	var once sync.Once
	held := make(chan struct{})
	kf.ControlKey(int16(kmsg.Fetch), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() {
			close(held)
			kf.SleepControl(func() { <-release })
		})
		return nil, nil, false
	})
	s := newSink(t, c.Addrs(), transactional("recovering"))
	started := make(chan error, 1)
	go func() { started <- s.Start(context.Background(), relay.Session{}) }()
	select {
	case <-held:
	case err := <-started:
		t.Fatalf("Start returned %v without reading the progress topic", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Start never read the progress topic")
	}
	if err := s.Ready(context.Background()); err == nil {
		t.Fatal("Ready passed while Start was still recovering")
	} else {
		t.Logf("while recovering: %v", err)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if err := s.Ready(context.Background()); err != nil {
		t.Fatalf("Ready after Start: %v", err)
	}
}
