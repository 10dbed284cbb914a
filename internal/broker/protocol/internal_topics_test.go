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
	"github.com/twmb/franz-go/pkg/kmsg"
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

// TestConsumerOffsetsServedReadOnly: __consumer_offsets is served as a
// read-only partition, empty before any commit, as franz-go's Test848RegexBrokerResolves
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
			switch r.Topic {
			case "orders":
				got++
			case "__consumer_offsets":
			default:
				t.Fatalf("read a record of %q", r.Topic)
			}
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

// TestConsumerOffsetsShowsCommits: each offset a group commits appears in
// __consumer_offsets as Kafka writes it (an OffsetCommitKey v1 and
// OffsetCommitValue v1, which lag checkers such as Burrow decode), in
// commit order, to a consumer that polls from the start while the commits
// are made; ListOffsets reports the end after them.
func TestConsumerOffsetsShowsCommits(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "orders", 2)
	cl := newKgo(t, f.addr)
	defer cl.Close()
	adm := kadm.NewClient(cl)

	reader := newKgo(t, f.addr, kgo.ConsumeTopics("__consumer_offsets"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(5*time.Second))
	defer reader.Close()
	polled := make(chan []*kgo.Record, 1)
	go func() {
		var recs []*kgo.Record
		for len(recs) < 3 && ctx.Err() == nil {
			fs := reader.PollFetches(ctx)
			fs.EachError(func(topic string, p int32, err error) { t.Errorf("fetch %s/%d: %v", topic, p, err) })
			recs = append(recs, fs.Records()...)
		}
		polled <- recs
	}()

	first := kadm.Offsets{}
	first.Add(kadm.Offset{Topic: "orders", Partition: 0, At: 7, LeaderEpoch: -1, Metadata: "m0"})
	first.Add(kadm.Offset{Topic: "orders", Partition: 1, At: 3, LeaderEpoch: -1})
	if r, err := adm.CommitOffsets(ctx, "lagged", first); err != nil || r.Error() != nil {
		t.Fatalf("commit: %v %v", err, r.Error())
	}
	second := kadm.Offsets{}
	second.Add(kadm.Offset{Topic: "orders", Partition: 0, At: 9, LeaderEpoch: -1})
	if r, err := adm.CommitOffsets(ctx, "lagged", second); err != nil || r.Error() != nil {
		t.Fatalf("commit: %v %v", err, r.Error())
	}

	recs := <-polled
	var got []string
	for i, r := range recs {
		if r.Offset != int64(i) {
			t.Errorf("record %d at offset %d", i, r.Offset)
		}
		var k kmsg.OffsetCommitKey
		var v kmsg.OffsetCommitValue
		if err := k.ReadFrom(r.Key); err != nil {
			t.Fatalf("key %x: %v", r.Key, err)
		}
		if err := v.ReadFrom(r.Value); err != nil {
			t.Fatalf("value %x: %v", r.Value, err)
		}
		if k.Version != 1 || v.Version != 1 || v.CommitTimestamp <= 0 || v.ExpireTimestamp != -1 {
			t.Errorf("record %d: key %+v value %+v", i, k, v)
		}
		got = append(got, fmt.Sprintf("%s %s/%d=%d %q", k.Group, k.Topic, k.Partition, v.Offset, v.Metadata))
	}
	slices.Sort(got[:2])
	want := []string{`lagged orders/0=7 "m0"`, `lagged orders/1=3 ""`, `lagged orders/0=9 ""`}
	if !slices.Equal(got, want) {
		t.Fatalf("__consumer_offsets holds %q, want %q", got, want)
	}
	end, err := adm.ListEndOffsets(ctx, "__consumer_offsets")
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := end.Lookup("__consumer_offsets", 0); o.Err != nil || o.Offset != 3 {
		t.Fatalf("__consumer_offsets end offset %+v, want 3", o)
	}
}
