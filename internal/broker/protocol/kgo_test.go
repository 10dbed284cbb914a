package protocol

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kgo"
)

func newKgo(t testing.TB, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatalf("kgo client: %v", err)
	}
	return cl
}

func produceKeyed(t testing.TB, ctx context.Context, cl *kgo.Client, topic string, n int) {
	t.Helper()
	rs := make([]*kgo.Record, n)
	for i := range rs {
		rs[i] = &kgo.Record{Topic: topic, Key: []byte("key-" + strconv.Itoa(i)), Value: []byte("value-" + strconv.Itoa(i))}
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func TestKgoProduceConsumeAndKeyPartitioning(t *testing.T) {
	t.Parallel()
	const topic, parts, n = "orders", 6, 600
	f, ctx := setupTopic(t, topic, parts, 60*time.Second)

	prod := newKgo(t, f.addr, kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	defer prod.Close()
	produceKeyed(t, ctx, prod, topic, n)

	for p := int32(0); p < parts; p++ {
		res, err := f.b.Fetch(ctx, topic, p, 0, 1<<20)
		if err != nil {
			t.Fatalf("fetch %d: %v", p, err)
		}
		for r, err := range broker.ReadRecords(res.Batches) {
			if err != nil {
				t.Fatalf("read records: %v", err)
			}
			if want := broker.PartitionForKey(r.Key, parts); want != p {
				t.Errorf("key %q on partition %d, want %d", r.Key, p, want)
			}
		}
	}

	cons := newKgo(t, f.addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cons.Close()
	seen := map[string]bool{}
	for len(seen) < n {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("consumed %d of %d: %v", len(seen), n, err)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			if want := "value-" + string(r.Key[len("key-"):]); string(r.Value) != want {
				t.Errorf("record %q=%q, want value %q", r.Key, r.Value, want)
			}
			if want := broker.PartitionForKey(r.Key, parts); want != r.Partition {
				t.Errorf("key %q consumed from partition %d, want %d", r.Key, r.Partition, want)
			}
			seen[string(r.Key)] = true
		})
	}
}

func TestKgoIdempotentProducerNoDuplicates(t *testing.T) {
	t.Parallel()
	const topic = "idem"
	f, ctx := setupTopic(t, topic, 3, 60*time.Second)
	cl := newKgo(t, f.addr, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond))
	defer cl.Close()
	var wg sync.WaitGroup
	const n = 5000
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		cl.Produce(ctx, &kgo.Record{Value: []byte(fmt.Sprint(i))}, func(_ *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("produce: %v", err)
	}
	var total int64
	for p := int32(0); p < 3; p++ {
		start, hw, err := f.b.Offsets(topic, p)
		if err != nil {
			t.Fatal(err)
		}
		total += hw - start
		if hw == 0 {
			continue
		}
		st, ok, err := f.b.ProducerState(topic, p, producerIDOf(t, f, topic, p))
		if err != nil || !ok || st.Epoch != 0 {
			t.Errorf("partition %d producer state %+v ok=%v err=%v", p, st, ok, err)
		}
	}
	if total != n {
		t.Fatalf("log holds %d records, produced %d", total, n)
	}
}

// producerIDOf reads the producer id of the partition's first batch.
func producerIDOf(t testing.TB, f *fixture, topic string, p int32) int64 {
	t.Helper()
	res, err := f.b.Fetch(context.Background(), topic, p, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := broker.ParseBatchHeader(res.Batches)
	if err != nil {
		t.Fatal(err)
	}
	if h.ProducerID < 0 {
		t.Fatalf("batch on %s/%d is not idempotent", topic, p)
	}
	return h.ProducerID
}
