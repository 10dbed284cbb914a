package protocol

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// txnBenchBatch is the records per transaction (and per produce call in
// the plain case).
const txnBenchBatch = 100

// txnBenchRead is how many records the consumers read per operation.
const txnBenchRead = 50000

// BenchmarkTxn compares, against the same broker in the same run, a
// transactional producer (one transaction of txnBenchBatch records per
// operation: AddPartitionsToTxn, produce, EndTxn with its markers) with an
// idempotent one producing the same records, and a read_committed consumer
// of txnBenchRead records written in such transactions with a
// read_uncommitted consumer of as many written without. Each reports
// records/s; compare them as ratios.
func BenchmarkTxn(b *testing.B) {
	value := make([]byte, 200)
	records := func(topic string, i int) []*kgo.Record {
		rs := make([]*kgo.Record, txnBenchBatch)
		for j := range rs {
			rs[j] = &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i*txnBenchBatch + j)), Value: value}
		}
		return rs
	}
	// One broker for all four, created here so that it outlives the sub-
	// benchmarks; the consumers read everything the producers wrote.
	f := setup(b, nil)
	for _, topic := range []string{"bench-plain", "bench-txn", "read-plain", "read-txn"} {
		f.createTopic(b, topic, benchPartitions)
	}
	fill := func(topic string, txn bool) {
		opts := []kgo.Opt{kgo.DefaultProduceTopic(topic)}
		if txn {
			opts = append(opts, kgo.TransactionalID("fill"))
		}
		cl := newKgo(b, f.addr, opts...)
		defer cl.Close()
		ctx := context.Background()
		for i := 0; i < txnBenchRead/txnBenchBatch; i++ {
			produceSync(b, ctx, cl, txn, records(topic, i))
		}
	}
	fill("read-plain", false)
	fill("read-txn", true)
	produce := func(b *testing.B, txn bool) {
		topic := "bench-plain"
		opts := []kgo.Opt{kgo.ProducerLinger(0)}
		if txn {
			topic = "bench-txn"
			opts = append(opts, kgo.TransactionalID("bench"))
		}
		cl := newKgo(b, f.addr, opts...)
		defer cl.Close()
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			produceSync(b, ctx, cl, txn, records(topic, i))
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N*txnBenchBatch)/b.Elapsed().Seconds(), "records/s")
	}
	consume := func(b *testing.B, topic string, committed bool) {
		n := txnBenchRead
		iso := kgo.ReadUncommitted()
		if committed {
			iso = kgo.ReadCommitted()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cl := newKgo(b, f.addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(iso))
			for got := 0; got < n; {
				fs := cl.PollFetches(ctx)
				if err := fs.Err0(); err != nil {
					b.Fatal(err)
				}
				got += fs.NumRecords()
			}
			cl.Close()
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "records/s")
	}
	b.Run("produce/idempotent", func(b *testing.B) { produce(b, false) })
	b.Run("produce/transactional", func(b *testing.B) { produce(b, true) })
	b.Run("consume/read_uncommitted", func(b *testing.B) { consume(b, "read-plain", false) })
	b.Run("consume/read_committed", func(b *testing.B) { consume(b, "read-txn", true) })
}

// produceSync produces recs and waits for them, in a transaction of their
// own when txn.
func produceSync(b *testing.B, ctx context.Context, cl *kgo.Client, txn bool, recs []*kgo.Record) {
	if txn {
		if err := cl.BeginTransaction(); err != nil {
			b.Fatal(err)
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		b.Fatal(err)
	}
	if txn {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			b.Fatal(err)
		}
	}
}
