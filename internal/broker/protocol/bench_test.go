package protocol

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const benchPartitions = 3

// benchTarget is a Kafka endpoint with a fresh topic.
type benchTarget struct {
	name  string
	start func(b *testing.B, topic string) string
}

var benchTargets = []benchTarget{
	{"relay", func(b *testing.B, topic string) string {
		f := setup(b, nil)
		f.createTopic(b, topic, benchPartitions)
		return f.addr
	}},
	{"kfake", func(b *testing.B, topic string) string {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchPartitions, topic))
		if err != nil {
			b.Fatalf("kfake: %v", err)
		}
		b.Cleanup(c.Close)
		return c.ListenAddrs()[0]
	}},
}

// BenchmarkProduceConsume measures kgo's produce rate (idempotent,
// acks=all, the defaults) and consume rate against this server and, with
// the same client workload, against franz-go's kfake cluster.
//
//	go test -run '^$' -bench ProduceConsume -benchtime 400000x ./internal/broker/protocol/
func BenchmarkProduceConsume(b *testing.B) {
	for _, size := range []int{100, 1024} {
		for _, target := range benchTargets {
			b.Run("produce/"+strconv.Itoa(size)+"B/"+target.name, func(b *testing.B) {
				addr := target.start(b, "bench")
				benchProduce(b, addr, size)
			})
			b.Run("consume/"+strconv.Itoa(size)+"B/"+target.name, func(b *testing.B) {
				addr := target.start(b, "bench")
				benchConsume(b, addr, size)
			})
		}
	}
}

func produceN(b *testing.B, cl *kgo.Client, n, size int) {
	value := make([]byte, size)
	var wg sync.WaitGroup
	var once sync.Once
	ctx := context.Background()
	wg.Add(n)
	for range n {
		cl.Produce(ctx, &kgo.Record{Topic: "bench", Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				once.Do(func() { b.Errorf("produce: %v", err) })
			}
			wg.Done()
		})
	}
	wg.Wait()
}

func benchProduce(b *testing.B, addr string, size int) {
	cl := newKgo(b, addr, kgo.MaxBufferedRecords(1<<20), kgo.ProducerLinger(0))
	defer cl.Close()
	produceN(b, cl, 1000, size) // warm up: metadata, producer id, connections
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	produceN(b, cl, b.N, size)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}

func benchConsume(b *testing.B, addr string, size int) {
	prod := newKgo(b, addr, kgo.MaxBufferedRecords(1<<20))
	produceN(b, prod, b.N, size)
	prod.Close()

	cl := newKgo(b, addr, kgo.ConsumeTopics("bench"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b.SetBytes(int64(size))
	b.ResetTimer()
	start := time.Now()
	for got := 0; got < b.N; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			b.Fatalf("consumed %d of %d: %v", got, b.N, err)
		}
		fs.EachError(func(t string, p int32, err error) { b.Fatalf("fetch %s/%d: %v", t, p, err) })
		got += fs.NumRecords()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
}
