package kafka_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// missingTopicWait is how long the topic stays missing in the missing
// topic tests: thirty retries of the core (one a second) and more than one
// interval of its log line (30 s), as a new user who creates the topic
// after seeing the relay's complaint.
const missingTopicWait = 32 * time.Second

// TestE2EKafkaMissingTopic is issue 16's acceptance for the Kafka sink:
// `relay run --sink kafka` without --kafka-create-topics, on a cluster
// that does not create topics either, while 8 writers commit events over
// 100 keys for a topic that does not exist yet. The events wait in the
// outbox (WatchWaiting: /readyz fails naming the topic, the metric has
// its sample, `relay status` its line, nothing leaves the outbox, no dead
// letter); the topic is then created by a Kafka client, and every event
// is published exactly once (no repeats at all, in the at-least-once mode
// too: nothing was produced before), in per-key commit order, with no
// dead letter, read back by a Kafka consumer.
func TestE2EKafkaMissingTopic(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		k := newKafkaRelay(t, "poll", transactionalID(txn, "relay-e2e-missing"))
		k.args = slices.DeleteFunc(k.args, func(a string) bool { return a == "--kafka-create-topics" })
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		proc := k.start()
		e2e.WaitReady(t, proc, true, time.Minute)

		ledger := e2e.NewLedger()
		stopWriting := e2e.WriteSteadily(ctx, e2e.WriterConfig{URL: k.url, Schema: "outbox", Topic: "orders", Writers: 8,
			Events: 200, Keys: 100, PerTx: 4, PayloadBytes: 100}, ledger, 200*time.Millisecond)
		e2e.WaitReady(t, proc, false, time.Minute)
		w := e2e.WatchWaiting(t, proc, k.bin, k.url, "orders", missingTopicWait)
		t.Logf("while the topic was missing: /readyz %q; outbox rows %v; relay status:\n%s", w.Reason, w.Rows, w.Status)

		admin, err := kgo.NewClient(kgo.SeedBrokers(k.cluster.Addrs()...))
		if err != nil {
			t.Fatal(err)
		}
		defer admin.Close()
		created, err := kadm.NewClient(admin).CreateTopics(ctx, e2eParts, 1, nil, "orders")
		if err == nil {
			err = created.Error()
		}
		if err != nil {
			t.Fatalf("creating the topic: %v", err)
		}
		e2e.ResumeAfterWaiting(t, proc, k.url, stopWriting)
		k.stop(proc)

		res := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", txn), ledger, e2eParts)
		if res.dups > 0 {
			t.Errorf("%v: events published more than once", res)
		}
		logged := e2e.CheckWaitEnded(t, k.url, proc.Output(), len(ledger.Committed))
		t.Logf("%d events committed, %v; the wait logged %d times", len(ledger.Committed), res, logged)
	})
}
