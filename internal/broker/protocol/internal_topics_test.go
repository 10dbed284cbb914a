package protocol

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// TestConsumerOffsetsServedReadOnly: __consumer_offsets is served as an
// empty, read-only partition, as franz-go's Test848RegexBrokerResolves
// needs of it: ListOffsets answers 0 (kadm), a Produce is refused with
// INVALID_TOPIC_EXCEPTION as Kafka refuses clients' appends to internal
// topics, and a KIP-848 consumer whose regex the coordinator resolves is
// assigned it beside the users' topic, consumes the users' records, and
// fetches the internal topic without error.
func TestConsumerOffsetsServedReadOnly(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "orders", 1)
	cl := newKgo(t, f.addr, kgo.RequestRetries(1))
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for what, list := range map[string]func(context.Context, ...string) (kadm.ListedOffsets, error){
		"start": adm.ListStartOffsets, "end": adm.ListEndOffsets,
	} {
		listed, err := list(ctx, "__consumer_offsets")
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := listed.Lookup("__consumer_offsets", 0); !ok || o.Err != nil || o.Offset != 0 {
			t.Fatalf("__consumer_offsets %s offset: %+v (listed %v), want 0", what, o, ok)
		}
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "__consumer_offsets", Value: []byte("x")}).FirstErr(); !errors.Is(err, kerr.InvalidTopicException) {
		t.Fatalf("producing to __consumer_offsets: %v, want INVALID_TOPIC_EXCEPTION", err)
	}
	produceKeyed(t, ctx, cl, "orders", 3)

	var fetchErrs []error
	consumer := newKgo(t, f.addr, kgo.ConsumerGroup("regex-848"), kgo.ServerSideBalancer(), kgo.ConsumeRegex(),
		kgo.ConsumeTopics("orders", "__consumer_offsets"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	defer consumer.Close()
	got := 0
	for got < 3 {
		fs := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of 3 records: %v", got, err)
		}
		fs.EachError(func(topic string, p int32, err error) {
			fetchErrs = append(fetchErrs, fmt.Errorf("%s/%d: %w", topic, p, err))
		})
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic != "orders" {
				t.Fatalf("read a record of %q", r.Topic)
			}
			got++
		})
	}
	if len(fetchErrs) > 0 {
		t.Fatalf("fetch errors: %v", fetchErrs)
	}
	for {
		if topics := consumer.GetConsumeTopics(); slices.Contains(topics, "__consumer_offsets") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the coordinator did not assign __consumer_offsets; consuming %v", consumer.GetConsumeTopics())
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		consumer.PollFetches(pctx)
		cancel()
	}
}
