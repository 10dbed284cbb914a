package cli_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// TestEmbeddedMissingTopic is issue 16's acceptance for the embedded
// broker: `relay run --create-topics=false` while 8 writers commit events
// over 100 keys for a topic the broker does not have. Neither the relay
// nor a Kafka client's metadata request creates it; the events wait in
// the outbox for 32 s (e2e.WatchWaiting: /readyz fails naming the topic,
// the metric has its sample, `relay status` its line, nothing leaves the
// outbox, no dead letter: thirty retries and more than one log interval);
// then a Kafka client creates the topic through the listener, and a Kafka
// consumer reads every event back exactly once, in per-key commit order,
// with no dead letter.
func TestEmbeddedMissingTopic(t *testing.T) {
	t.Parallel()
	const wait = 32 * time.Second
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr := e2e.FreeAddr(t), e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", httpAddr,
		"--kafka-addr", kafkaAddr, "--create-topics=false", "--poll-interval", "200ms")
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	ledger := e2e.NewLedger()
	stopWriting := e2e.WriteSteadily(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 8,
		Events: 200, Keys: 100, PerTx: 4, PayloadBytes: 100}, ledger, 200*time.Millisecond)
	e2e.WaitReady(t, p, false, time.Minute)

	cl := kafkaClient(t, kafkaAddr)
	adm := kadm.NewClient(cl)
	// A client's metadata request asking for auto-creation does not
	// create it either.
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = true
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("orders")
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Topics) != 1 || resp.Topics[0].ErrorCode != kerr.UnknownTopicOrPartition.Code {
		t.Fatalf("metadata for the missing topic, auto-creation asked: %+v", resp.Topics)
	}
	w := e2e.WatchWaiting(t, p, bin, url, "orders", wait)
	t.Logf("while the topic was missing: /readyz %q; outbox rows %v; relay status:\n%s", w.Reason, w.Rows, w.Status)

	created, err := adm.CreateTopics(ctx, 6, 1, nil, "orders")
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		t.Fatalf("creating the topic through the listener: %v", err)
	}
	e2e.ResumeAfterWaiting(t, p, url, stopWriting)

	var records []e2e.Record
	for _, r := range kafkatest.Read(t, []string{kafkaAddr}, "orders", false) {
		rec := e2e.Record{Topic: "orders", Partition: r.Partition, Key: string(r.Key), KeyBytes: r.Key, Value: r.Value, Headers: map[string]string{}}
		for _, h := range r.Headers {
			rec.Headers[h.Key] = string(h.Value)
		}
		records = append(records, rec)
	}
	n := e2e.Check(t, records, ledger)
	p.Stop(time.Minute)
	logged := e2e.CheckWaitEnded(t, url, p.Output(), len(ledger.Committed))
	t.Logf("%d events committed, %d read back once each in per-key order; the wait logged %d times", len(ledger.Committed), n, logged)
}
