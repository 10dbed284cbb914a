// Package kafkatest runs a Kafka cluster for tests (franz-go's kfake, in
// process) that can stop and come back at the same addresses with its
// data, and reads topics back as relaytest records. Only tests import it.
package kafkatest

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// Cluster is a one-broker kfake cluster persisted in a temporary
// directory, on a fixed port.
type Cluster struct {
	t    testing.TB
	opts []kfake.Opt
	addr string

	mu sync.Mutex
	c  *kfake.Cluster
}

// Start starts a cluster, stopped in t.Cleanup. opts are added to the
// defaults (one broker, its data in t.TempDir()).
func Start(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("kafkatest: finding a free port: %v", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	c := &Cluster{
		t:    t,
		addr: ln.Addr().String(),
		opts: append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(t.TempDir())}, opts...),
	}
	c.Restart()
	t.Cleanup(c.Stop)
	return c
}

// Addrs are the brokers' addresses; they stay the same across restarts.
func (c *Cluster) Addrs() []string { return []string{c.addr} }

// Records returns a counter of the records of topic in the cluster: the
// sum of its partitions' end offsets, or of their last stable offsets
// (committed data only) when committed. It returns -1 when the cluster
// does not answer.
func (c *Cluster) Records(t testing.TB, topic string, committed bool) func() int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	t.Cleanup(cl.Close)
	adm := kadm.NewClient(cl)
	return func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		list := adm.ListEndOffsets
		if committed {
			list = adm.ListCommittedOffsets
		}
		offsets, err := list(ctx, topic)
		if err != nil {
			return -1
		}
		var n int64
		offsets.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				n += o.Offset
			}
		})
		return n
	}
}

// Kfake returns the running kfake cluster, nil while stopped.
func (c *Cluster) Kfake() *kfake.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

// Stop stops the cluster: connections are cut and the port refuses
// connections until Restart. Stopping a stopped cluster does nothing.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		c.c.Close()
		c.c = nil
	}
}

// Restart starts a stopped cluster again with its data. It retries for a
// few seconds while the port is still held.
func (c *Cluster) Restart() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		return
	}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		c.c, err = kfake.NewCluster(c.opts...)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("kafkatest: starting kfake: %v", err)
	}
}

// Outage stops the cluster for d, then starts it again.
func (c *Cluster) Outage(d time.Duration) {
	c.Stop()
	time.Sleep(d)
	c.Restart()
}

// Read returns every record of topic on brokers, by partition and offset.
// committed reads read_committed (what an exactly-once consumer sees); it
// first appends an end marker to each partition, outside any transaction,
// and reads until it has seen them all (the marker is not returned). A
// transaction left open holds the read until the cluster aborts it.
func Read(t testing.TB, brokers []string, topic string, committed bool) []relaytest.Record {
	t.Helper()
	return AsRecords(ReadRecords(t, brokers, topic, committed))
}

// AsRecords converts Kafka records into the core's test records, which
// relaytest's and e2e's checkers read.
func AsRecords(records []*kgo.Record) []relaytest.Record {
	out := make([]relaytest.Record, len(records))
	for i, r := range records {
		out[i] = relaytest.Record{Partition: r.Partition, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
		for _, h := range r.Headers {
			out[i].Headers = append(out[i].Headers, relay.Header{Key: h.Key, Value: h.Value})
		}
	}
	return out
}

// ReadRecords is Read returning the client's records, which also tell
// each record's offset and the producer id and epoch that wrote it. opts
// are added to its client's options (SASL credentials, say).
//
// It reads with plain Fetch requests, one partition at a time from offset
// 0 to the end listed first, and decodes them with franz-go's own batch
// processing (kgo.ProcessFetchPartition) and Decompressor, rather than
// through a consumer: each request has its own timeout and every error is
// kept, so a read that cannot finish names the partition, the offset and
// the last error it saw. (A consumer's read-back once looked stuck after
// one fetch; the time went into lz4 under -race, see Decompressor.)
func ReadRecords(t testing.TB, brokers []string, topic string, committed bool, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	ctx := context.Background()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner())}, opts...)...)
	if err != nil {
		t.Fatalf("kafkatest: %v", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("kafkatest: listing end offsets of %s: %v", topic, err)
	}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			end[o.Partition] = o.Offset
		}
	})
	if len(end) == 0 {
		return nil
	}
	if committed {
		for p := range end {
			r := &kgo.Record{Topic: topic, Partition: p, Value: []byte(endMarker), Headers: []kgo.RecordHeader{{Key: endMarker}}}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("kafkatest: writing the end marker: %v", err)
			}
			end[p] = r.Offset + 1
		}
	}
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("kafkatest: metadata of %s: %v", topic, err)
	}
	id := md.Topics[topic].ID
	parts := slices.Sorted(maps.Keys(end))
	var got []*kgo.Record
	deadline := time.Now().Add(2 * time.Minute)
	for _, p := range parts {
		rs, err := readPartition(ctx, cl, topic, id, p, end[p], committed, deadline)
		if err != nil {
			t.Fatalf("kafkatest: reading %s: %v", topic, err)
		}
		got = append(got, rs...)
	}
	return got
}

// readPartition fetches partition p of topic from offset 0 until the
// offset before end, retrying failed requests until deadline. It returns
// the records in offset order, without the end markers.
func readPartition(ctx context.Context, cl *kgo.Client, topic string, id kadm.TopicID, p int32, end int64, committed bool, deadline time.Time) ([]*kgo.Record, error) {
	iso, level := kgo.ReadUncommitted(), int8(0)
	if committed {
		iso, level = kgo.ReadCommitted(), 1
	}
	var out []*kgo.Record
	var lastErr error
	dec := Decompressor()
	next := int64(0)
	for next < end {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("partition %d: at offset %d of %d when the time ran out; last error: %v", p, next, end, lastErr)
		}
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID = -1
		req.MaxWaitMillis = 100
		req.MinBytes = 1
		req.MaxBytes = 8 << 20
		req.IsolationLevel = level
		req.SessionEpoch = -1
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, id
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, next, 1<<20
		rp.CurrentLeaderEpoch, rp.LastFetchedEpoch, rp.LogStartOffset = -1, -1, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := req.RequestWith(rctx, cl)
		cancel()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		progressed := false
		for _, t := range resp.Topics {
			for i := range t.Partitions {
				if t.Partitions[i].Partition != p {
					continue
				}
				fp, after := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Topic: topic, Partition: p, Offset: next, IsolationLevel: iso}, &t.Partitions[i], dec, nil)
				if fp.Err != nil {
					lastErr = fp.Err
				}
				for _, r := range fp.Records {
					if len(r.Headers) == 1 && r.Headers[0].Key == endMarker {
						continue
					}
					out = append(out, r)
				}
				progressed = after > next
				if !progressed && fp.Err == nil {
					lastErr = stall(&t.Partitions[i], next)
				}
				next = max(next, after)
			}
		}
		if !progressed {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return out, nil
}

// stall describes a fetch response that moved a partition's read no
// further: its offsets, and the head of its first batch.
func stall(rp *kmsg.FetchResponseTopicPartition, at int64) error {
	b := rp.RecordBatches
	head := "no batch bytes"
	if len(b) >= 17 {
		head = fmt.Sprintf("first batch: base offset %d, length %d (+12), magic %d", int64(binary.BigEndian.Uint64(b)), int32(binary.BigEndian.Uint32(b[8:])), b[16])
	}
	return fmt.Errorf("a fetch at offset %d returned nothing to read: error code %d, high watermark %d, last stable offset %d, log start %d, %d bytes of batches, %s",
		at, rp.ErrorCode, rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset, len(b), head)
}

const endMarker = "kafkatest-end"
