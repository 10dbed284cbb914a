package broker

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"
)

func benchBatch(recordSize int) []byte {
	rs := make([]Record, 1000)
	for i := range rs {
		rs[i] = Record{Key: []byte(fmt.Sprintf("key-%06d", i)), Value: bytes.Repeat([]byte{'x'}, recordSize), Timestamp: time.UnixMilli(1_700_000_000_000)}
	}
	return EncodeBatch(-1, -1, -1, rs)
}

// runAppenders splits b.N batch appends across producers goroutines, each
// appending to partition (i % partitions).
func runAppenders(b *testing.B, br *Broker, topic string, partitions, producers, recordSize int) {
	proto := benchBatch(recordSize)
	b.SetBytes(int64(len(proto)))
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < producers; w++ {
		n := b.N / producers
		if w < b.N%producers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			batch := append([]byte(nil), proto...)
			for i := 0; i < n; i++ {
				if _, err := br.Append(context.Background(), topic, int32(w%partitions), batch); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)*1000/time.Since(start).Seconds(), "records/s")
}

func BenchmarkAppend(b *testing.B) {
	type cfg struct {
		name       string
		sync       SyncPolicy
		partitions int
		producers  int
		recordSize int
	}
	var cases []cfg
	for _, parts := range []int{1, 8} {
		for _, size := range []int{100, 1024} {
			cases = append(cases, cfg{fmt.Sprintf("interval/partitions=%d/record=%dB", parts, size), SyncIntervalUnsafe, parts, parts, size})
		}
	}
	cases = append(cases,
		cfg{"fsync-before-ack/partitions=1/producers=8/record=100B", SyncBeforeAck, 1, 8, 100},
		cfg{"fsync-before-ack/partitions=8/producers=8/record=100B", SyncBeforeAck, 8, 8, 100},
		cfg{"fsync-before-ack/partitions=1/producers=1/record=100B", SyncBeforeAck, 1, 1, 100},
	)
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			br := openTest(b, b.TempDir(), func(o *Options) { o.Sync = c.sync })
			mustCreate(b, br, "bench", TopicConfig{Partitions: int32(c.partitions), SegmentBytes: 256 << 20})
			runAppenders(b, br, "bench", c.partitions, c.producers, c.recordSize)
		})
	}
}

func BenchmarkFetch(b *testing.B) {
	br := openTest(b, b.TempDir(), func(o *Options) { o.Sync = SyncIntervalUnsafe })
	mustCreate(b, br, "bench", TopicConfig{SegmentBytes: 16 << 20})
	proto := benchBatch(100)
	const batches = 200
	for i := 0; i < batches; i++ {
		mustAppend(b, br, "bench", 0, append([]byte(nil), proto...))
	}
	if err := br.Sync(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	var records, bytesRead int64
	off := int64(0)
	for i := 0; i < b.N; i++ {
		res, err := br.Fetch(context.Background(), "bench", 0, off, 1<<20)
		if err != nil {
			b.Fatal(err)
		}
		for batch, err := range Batches(res.Batches) {
			if err != nil {
				b.Fatal(err)
			}
			h, _ := ParseBatchHeader(batch)
			records += int64(h.NumRecords)
			off = h.LastOffset() + 1
		}
		bytesRead += int64(len(res.Batches))
		if off >= res.HighWatermark {
			off = 0
		}
	}
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(records)/el, "records/s")
	b.ReportMetric(float64(bytesRead)/el/1e6, "MB/s")
}

// BenchmarkValidateProduced measures the checks a produced batch of 1000
// records passes before it is written (CRC, decompression, record walk),
// per record.
func BenchmarkValidateProduced(b *testing.B) {
	for _, c := range []Compression{CompressionNone, CompressionSnappy} {
		for _, size := range []int{100, 1024} {
			b.Run(fmt.Sprintf("%s/record=%dB", c, size), func(b *testing.B) {
				rng := rand.New(rand.NewPCG(1, uint64(size)))
				words := []string{"order", "created", "customer", "amount", "EUR", "shipped", "status", "pending", "item", "sku"}
				rs := make([]Record, 1000)
				for i := range rs {
					v := fmt.Appendf(nil, `{"id":%d,"fields":{`, rng.Uint64())
					for len(v) < size {
						v = fmt.Appendf(v, `"%s":"%s-%d",`, words[rng.IntN(len(words))], words[rng.IntN(len(words))], rng.IntN(100000))
					}
					rs[i] = Record{Key: fmt.Appendf(nil, "order-%d", i), Value: v[:size]}
				}
				batch, err := AppendBatch(nil, BatchOptions{ProducerID: 1, BaseSequence: 0, Compression: c}, rs)
				if err != nil {
					b.Fatal(err)
				}
				cfg := TopicConfig{}.withDefaults(1)
				b.SetBytes(int64(len(batch)))
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if _, err := validateProduced(batch, cfg, false); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(rs)), "ns/record")
			})
		}
	}
}

// BenchmarkCreateTopics creates 100 topics of 8 partitions one CreateTopic
// at a time, or with one EnsureTopics call; ns/op is per topic.
func BenchmarkCreateTopics(b *testing.B) {
	for _, how := range []string{"one-by-one", "ensure"} {
		b.Run(how, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				br := openTest(b, b.TempDir(), func(o *Options) { o.DefaultPartitions = 8 })
				var names []string
				for t := 0; t < 100; t++ {
					names = append(names, fmt.Sprint("t", t))
				}
				b.StartTimer()
				if how == "ensure" {
					if err := br.EnsureTopics(names); err != nil {
						b.Fatal(err)
					}
				} else {
					for _, n := range names {
						if _, err := br.CreateTopic(n, TopicConfig{}); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				_ = br.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/topic")
		})
	}
}

// thinParts is the partitions of each of thinTopics' topics.
const thinParts = 8

// thinTopics opens a broker with 1,000 topics of thinParts partitions and
// returns their names, with a batch of one 200-byte record.
func thinTopics(b *testing.B) (*Broker, []string, []byte) {
	br := openTest(b, b.TempDir(), func(o *Options) { o.DefaultPartitions = thinParts })
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("thin-%d", i)
	}
	if err := br.EnsureTopics(names); err != nil {
		b.Fatal(err)
	}
	return br, names, EncodeBatch(-1, -1, -1, []Record{{Key: []byte("key-000001"), Value: bytes.Repeat([]byte{'x'}, 200), Timestamp: time.UnixMilli(1_700_000_000_000)}})
}

// BenchmarkAppendThin appends one-record batches spread over the 8,000
// partitions of 1,000 topics under SyncBeforeAck, waiting for each page of
// 8,000 as the relay waits for a batch: a backlog spread thin over many
// topics, where every record is a record batch of its own.
func BenchmarkAppendThin(b *testing.B) {
	const page = 8000
	br, names, batch := thinTopics(b)
	waits := make([]func() error, 0, page)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		_, wait, err := br.AppendAsync(ctx, names[(i/thinParts)%len(names)], int32(i%thinParts), batch)
		if err != nil {
			b.Fatal(err)
		}
		if waits = append(waits, wait); len(waits) == page || i == b.N-1 {
			for _, w := range waits {
				if err := w(); err != nil {
					b.Fatal(err)
				}
			}
			waits = waits[:0]
		}
	}
}

// BenchmarkCheckpoint measures a journal checkpoint of the 8,000
// partitions of 1,000 topics, each written since the last one: an op is
// one checkpoint, its segments fsynced and their recovery points written.
func BenchmarkCheckpoint(b *testing.B) {
	br, names, batch := thinTopics(b)
	j := br.journal
	// round writes a batch to every partition, waits for the journal's
	// fsync of them all, and starts a new journal file, leaving the old
	// one to the checkpoint.
	round := func() {
		appendEverywhere(b, br, names, batch)
		j.mu.Lock()
		err := j.rotateLocked(-1)
		j.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
	// The first checkpoint creates the recovery points.
	round()
	if err := j.checkpoint(); err != nil {
		b.Fatal(err)
	}
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		round()
		b.StartTimer()
		c := processCPU(b)
		if err := j.checkpoint(); err != nil {
			b.Fatal(err)
		}
		cpu += processCPU(b) - c
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkOpenThin measures an open, after a clean close, of a data
// directory holding the 8,000 partitions of 1,000 topics with a record
// each: the start of a relay that drains a backlog spread over many topics.
func BenchmarkOpenThin(b *testing.B) {
	br, names, batch := thinTopics(b)
	ctx := context.Background()
	appendEverywhere(b, br, names, batch)
	opts := br.opts
	if err := br.Close(); err != nil {
		b.Fatal(err)
	}
	var cpu time.Duration
	for b.Loop() {
		c := processCPU(b)
		again, err := Open(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		cpu += processCPU(b) - c
		b.StopTimer()
		if err := again.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// appendEverywhere appends batch to every partition of thinTopics' topics
// and waits until the journal's fsync covered them all.
func appendEverywhere(b *testing.B, br *Broker, names []string, batch []byte) {
	b.Helper()
	var waits []func() error
	for _, name := range names {
		for p := range int32(thinParts) {
			_, wait, err := br.AppendAsync(context.Background(), name, p, batch)
			if err != nil {
				b.Fatal(err)
			}
			waits = append(waits, wait)
		}
	}
	for _, wait := range waits {
		if err := wait(); err != nil {
			b.Fatal(err)
		}
	}
}
