package protocol

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const benchPartitions = 6

// benchTarget is a Kafka endpoint with a fresh topic. produceOnly marks a
// target that cannot be consumed from.
type benchTarget struct {
	name        string
	start       func(b *testing.B, topic string) string
	produceOnly bool
}

// benchTargets are the servers compared, each serving the same kgo clients
// with the same options and records in the same process:
//
//   - relay: the embedded broker with its default durability: a produce
//     response waits for an fsync of the batches it acknowledges.
//   - relay-interval: the same broker with SyncIntervalUnsafe (acknowledged
//     after the write, fsynced every second), the setting closest to kfake.
//   - kfake: franz-go's in-memory fake cluster, which never fsyncs.
//   - noop: kfake answering every Produce with success without looking at
//     or storing the batches, the rate of the producing clients themselves
//     (what no server can beat); produce only.
var benchTargets = []benchTarget{
	{name: "relay", start: func(b *testing.B, topic string) string {
		f := setup(b, nil)
		f.createTopic(b, topic, benchPartitions)
		return f.addr
	}},
	{name: "relay-interval", start: func(b *testing.B, topic string) string {
		f := setupBroker(b, broker.Options{Sync: broker.SyncIntervalUnsafe}, nil)
		f.createTopic(b, topic, benchPartitions)
		return f.addr
	}},
	{name: "kfake", start: func(b *testing.B, topic string) string {
		_, addr := newKfake(b, topic)
		return addr
	}},
	{name: "noop", produceOnly: true, start: func(b *testing.B, topic string) string {
		c, addr := newKfake(b, topic)
		var mu sync.Mutex
		next := map[int32]int64{}
		c.ControlKey(kmsg.Produce.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			req := kreq.(*kmsg.ProduceRequest)
			resp := req.ResponseKind().(*kmsg.ProduceResponse)
			mu.Lock()
			defer mu.Unlock()
			for _, rt := range req.Topics {
				t := kmsg.NewProduceResponseTopic()
				t.Topic, t.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					p := kmsg.NewProduceResponseTopicPartition()
					p.Partition, p.BaseOffset = rp.Partition, next[rp.Partition]
					if len(rp.Records) >= 61 {
						next[rp.Partition] += int64(binary.BigEndian.Uint32(rp.Records[57:]))
					}
					t.Partitions = append(t.Partitions, p)
				}
				resp.Topics = append(resp.Topics, t)
			}
			return resp, nil, true
		})
		return addr
	}},
}

func newKfake(b *testing.B, topic string) (*kfake.Cluster, string) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(benchPartitions, topic))
	if err != nil {
		b.Fatalf("kfake: %v", err)
	}
	b.Cleanup(c.Close)
	return c, c.ListenAddrs()[0]
}

// benchPayload makes the records of a workload: record i is records(i).
type benchPayload struct {
	name    string
	records func(size int) func(i int) *kgo.Record
}

var benchPayloads = []benchPayload{
	// zeros: unkeyed all-zero values, which snappy shrinks to almost
	// nothing (the best case for both servers).
	{"zeros", func(size int) func(int) *kgo.Record {
		value := make([]byte, size)
		return func(int) *kgo.Record { return &kgo.Record{Topic: "bench", Value: value} }
	}},
	// events: keyed, JSON-like values of random words and numbers, 4096
	// distinct ones, which snappy compresses about as much as real outbox
	// events (2-3x).
	{"events", func(size int) func(int) *kgo.Record {
		rng := rand.New(rand.NewPCG(1, uint64(size)))
		words := []string{"order", "created", "customer", "amount", "EUR", "shipped", "status", "pending", "item", "sku", "warehouse", "berlin", "paris", "total", "discount", "express"}
		values := make([][]byte, 4096)
		for i := range values {
			v := fmt.Appendf(nil, `{"id":%d,"ts":%d,"fields":{`, rng.Uint64(), rng.Int64N(1<<41))
			for len(v) < size-1 {
				v = fmt.Appendf(v, `"%s":"%s-%d",`, words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.IntN(100000))
			}
			v = append(v[:size-1], '}')
			values[i] = v
		}
		keys := make([][]byte, 1000)
		for i := range keys {
			keys[i] = []byte("order-" + strconv.Itoa(i))
		}
		return func(i int) *kgo.Record {
			return &kgo.Record{Topic: "bench", Key: keys[i%len(keys)], Value: values[i%len(values)]}
		}
	}},
}

// BenchmarkProduceConsume measures kgo's produce rate (idempotent,
// acks=all, snappy: the defaults) and consume rate against each of
// benchTargets, with the same clients, options and records. fetch-raw
// reads the same log with bare Fetch requests through kgo, counting records
// from the batch headers instead of decompressing and decoding them: the
// rate a server can serve when the consumer's own decoding is not what
// limits it. clients=N splits the work over N kgo clients (producers each
// send b.N/N records; consumers each read their share of the partitions),
// so that one client's own CPU does not cap both servers.
//
// The clients run in the same process as the servers and share the
// machine's cores with them, so a rate is bounded by the clients' own CPU:
// noop shows that bound for produce. Compare targets within one run.
//
//	go test -run '^$' -bench ProduceConsume -benchtime 1000000x -count 3 ./internal/broker/protocol/
func BenchmarkProduceConsume(b *testing.B) {
	for _, size := range []int{100, 1024} {
		for _, payload := range benchPayloads {
			for _, clients := range []int{1, 3} {
				for _, target := range benchTargets {
					name := fmt.Sprintf("%dB/%s/clients=%d/%s", size, payload.name, clients, target.name)
					b.Run("produce/"+name, func(b *testing.B) {
						addr := startServer(b, target)
						benchProduce(b, addr, payload.records(size), size, clients)
					})
					if target.produceOnly {
						continue
					}
					b.Run("consume/"+name, func(b *testing.B) {
						addr := startServer(b, target)
						benchConsume(b, addr, payload.records(size), size, clients)
					})
					b.Run("fetch-raw/"+name, func(b *testing.B) {
						addr := startServer(b, target)
						benchFetchRaw(b, addr, payload.records(size), size, clients)
					})
				}
			}
		}
	}
}

// startServer starts target under the pprof labels side=server and
// server=<target>, which every goroutine the server starts inherits, so
// that a CPU profile splits each server's CPU from the clients':
// go tool pprof -tags, or -tagfocus side=server.
func startServer(b *testing.B, target benchTarget) string {
	var addr string
	pprof.Do(context.Background(), pprof.Labels("side", "server", "server", target.name), func(context.Context) {
		addr = target.start(b, "bench")
	})
	return addr
}

// processCPU is the CPU time the process (clients, server and runtime
// together) has used so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startTimer starts the timed part of a benchmark of size-byte records and
// returns when it began and the process's CPU time then, for reportRates.
func startTimer(b *testing.B, size int) (start time.Time, cpu time.Duration) {
	b.SetBytes(int64(size))
	b.ResetTimer()
	return time.Now(), processCPU()
}

// reportRates reports records/s since start, and cpu-ns/record: the
// process's CPU time per record since cpu. With the same clients against
// every target, the latter tells the servers' CPU cost apart even when
// other work on the machine makes the rates noisy.
func reportRates(b *testing.B, start time.Time, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "records/s")
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/record")
}

// produceN sends records [from, from+n) through cl and waits for all acks.
func produceN(b *testing.B, cl *kgo.Client, record func(int) *kgo.Record, from, n int) {
	var wg sync.WaitGroup
	var once sync.Once
	ctx := context.Background()
	wg.Add(n)
	for i := from; i < from+n; i++ {
		cl.Produce(ctx, record(i), func(_ *kgo.Record, err error) {
			if err != nil {
				once.Do(func() { b.Errorf("produce: %v", err) })
			}
			wg.Done()
		})
	}
	wg.Wait()
}

// produceAll sends n records split evenly over the clients, concurrently.
func produceAll(b *testing.B, cls []*kgo.Client, record func(int) *kgo.Record, n int) {
	var wg sync.WaitGroup
	for c, cl := range cls {
		from, to := n*c/len(cls), n*(c+1)/len(cls)
		wg.Go(func() { produceN(b, cl, record, from, to-from) })
	}
	wg.Wait()
}

func newProducers(b *testing.B, addr string, clients int) []*kgo.Client {
	cls := make([]*kgo.Client, clients)
	for i := range cls {
		cls[i] = newKgo(b, addr, kgo.MaxBufferedRecords(1<<20), kgo.ProducerLinger(0))
	}
	return cls
}

func closeAll(cls []*kgo.Client) {
	for _, cl := range cls {
		cl.Close()
	}
}

func benchProduce(b *testing.B, addr string, record func(int) *kgo.Record, size, clients int) {
	cls := newProducers(b, addr, clients)
	defer closeAll(cls)
	produceAll(b, cls, record, 1000*clients) // warm up: metadata, producer ids, connections
	start, cpu := startTimer(b, size)
	produceAll(b, cls, record, b.N)
	reportRates(b, start, cpu)
}

func benchConsume(b *testing.B, addr string, record func(int) *kgo.Record, size, clients int) {
	prods := newProducers(b, addr, clients)
	produceAll(b, prods, record, b.N)
	closeAll(prods)

	// Each consumer reads a fixed share of the partitions to their end.
	type share struct {
		cl   *kgo.Client
		want int64
	}
	shares := make([]share, clients)
	adm := newKgo(b, addr)
	for c := range shares {
		parts := map[int32]kgo.Offset{}
		for p := int32(c); p < benchPartitions; p += int32(clients) {
			parts[p] = kgo.NewOffset().AtStart()
		}
		shares[c].cl = newKgo(b, addr, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{"bench": parts}))
		defer shares[c].cl.Close()
	}
	ends := listEnds(b, adm, "bench")
	adm.Close()
	var total int64
	for c := range shares {
		for p := int32(c); p < benchPartitions; p += int32(clients) {
			shares[c].want += ends[p]
		}
		total += shares[c].want
	}
	if total != int64(b.N) {
		b.Fatalf("log holds %d records, produced %d", total, b.N)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start, cpu := startTimer(b, size)
	var wg sync.WaitGroup
	for _, s := range shares {
		wg.Go(func() {
			for got := int64(0); got < s.want; {
				fs := s.cl.PollFetches(ctx)
				if err := ctx.Err(); err != nil {
					b.Errorf("consumed %d of %d: %v", got, s.want, err)
					return
				}
				fs.EachError(func(t string, p int32, err error) { b.Errorf("fetch %s/%d: %v", t, p, err) })
				got += int64(fs.NumRecords())
			}
		})
	}
	wg.Wait()
	reportRates(b, start, cpu)
}

// listEnds returns each partition's end offset, which is its record count
// here since every log starts at 0.
func listEnds(b *testing.B, cl *kgo.Client, topic string) map[int32]int64 {
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := int32(0); p < benchPartitions; p++ {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		b.Fatalf("list offsets: %v", err)
	}
	ends := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				b.Fatalf("list offsets %s/%d: %v", t.Topic, p.Partition, err)
			}
			ends[p.Partition] = p.Offset
		}
	}
	return ends
}

// benchFetchRaw reads every partition to its end with Fetch requests sent
// through kgo's Request, splitting partitions over clients like
// benchConsume, and counts records from the batch headers.
func benchFetchRaw(b *testing.B, addr string, record func(int) *kgo.Record, size, clients int) {
	prods := newProducers(b, addr, clients)
	produceAll(b, prods, record, b.N)
	closeAll(prods)
	cls := make([]*kgo.Client, clients)
	for i := range cls {
		cls[i] = newKgo(b, addr)
		defer cls[i].Close()
	}
	ends := listEnds(b, cls[0], "bench")
	mreq := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("bench")
	mreq.Topics = append(mreq.Topics, mt)
	mresp, err := mreq.RequestWith(context.Background(), cls[0])
	if err != nil || len(mresp.Topics) != 1 {
		b.Fatalf("metadata: %v", err)
	}
	topicID := mresp.Topics[0].TopicID // Fetch v13+ names topics by id
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start, cpu := startTimer(b, size)
	var wg sync.WaitGroup
	var total atomic.Int64
	for c, cl := range cls {
		wg.Go(func() {
			next := map[int32]int64{}
			for p := int32(c); p < benchPartitions; p += int32(clients) {
				next[p] = 0
			}
			for len(next) > 0 {
				req := kmsg.NewPtrFetchRequest()
				req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 500, 1, 50<<20
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic, rt.TopicID = "bench", topicID
				for p, off := range next {
					rp := kmsg.NewFetchRequestTopicPartition()
					rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, off, 1<<20
					rt.Partitions = append(rt.Partitions, rp)
				}
				req.Topics = append(req.Topics, rt)
				resp, err := req.RequestWith(ctx, cl)
				if err != nil {
					b.Errorf("fetch: %v", err)
					return
				}
				for _, t := range resp.Topics {
					for _, p := range t.Partitions {
						if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
							b.Errorf("fetch %d: %v", p.Partition, err)
							return
						}
						for data := p.RecordBatches; len(data) >= 61; {
							n := int(binary.BigEndian.Uint32(data[8:])) + 12
							if n > len(data) {
								break
							}
							base := int64(binary.BigEndian.Uint64(data))
							last := base + int64(binary.BigEndian.Uint32(data[23:]))
							if last >= next[p.Partition] {
								total.Add(int64(binary.BigEndian.Uint32(data[57:])))
								next[p.Partition] = last + 1
							}
							data = data[n:]
						}
						if next[p.Partition] >= ends[p.Partition] {
							delete(next, p.Partition)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	if total.Load() != int64(b.N) {
		b.Fatalf("fetched %d records, produced %d", total.Load(), b.N)
	}
	reportRates(b, start, cpu)
}
