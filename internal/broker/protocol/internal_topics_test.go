package protocol

import (
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestConsumerOffsetsIsListedInternal: Metadata lists __consumer_offsets
// marked internal, among all topics and when asked by name, as Kafka does
// (franz-go's regex consumer skips internal topics by that mark); nobody
// can create it, and a regex subscription matching everything consumes
// only the users' topic.
func TestConsumerOffsetsIsListedInternal(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *Config) { c.AutoCreateTopics = true })
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "orders", 2)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	all, err := adm.ListTopicsWithInternal(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := all["__consumer_offsets"]; !ok || !d.IsInternal {
		t.Fatalf("__consumer_offsets among all topics: %+v, listed %v", d, ok)
	}
	users, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := users["__consumer_offsets"]; ok || len(users) != 1 {
		t.Fatalf("topics without internal ones: %v", users.Names())
	}
	named, err := adm.ListTopicsWithInternal(ctx, "__consumer_offsets")
	if err != nil || !named["__consumer_offsets"].IsInternal || named["__consumer_offsets"].Err != nil {
		t.Fatalf("__consumer_offsets by name: %+v, %v", named, err)
	}
	created, err := adm.CreateTopics(ctx, 1, 1, nil, "__consumer_offsets")
	if err != nil {
		t.Fatal(err)
	}
	if r := created["__consumer_offsets"]; !errors.Is(r.Err, kerr.InvalidTopicException) {
		t.Fatalf("creating __consumer_offsets: %v, want INVALID_TOPIC_EXCEPTION", r.Err)
	}

	produceKeyed(t, ctx, cl, "orders", 5)
	consumer, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.ConsumeRegex(), kgo.ConsumeTopics(".*"), kgo.ConsumerGroup("regex"))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := 0
	for got < 5 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of 5 records: %v", got, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != "orders" {
				t.Fatalf("a regex consumer read topic %q", r.Topic)
			}
			got++
		})
	}
}
