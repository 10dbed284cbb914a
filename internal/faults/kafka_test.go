package faults_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// kafkaRecord is a record read back from Kafka with the producer that
// wrote it.
type kafkaRecord struct {
	partition  int32
	offset     int64
	key        string
	value      []byte
	headers    map[string]string
	producerID int64
}

// readKafka reads every record of topic, by partition and offset.
func readKafka(t *testing.T, brokers []string, topic string) []kafkaRecord {
	t.Helper()
	ctx := context.Background()
	admin, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ends, err := kadm.NewClient(admin).ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatalf("listing end offsets of %s: %v", topic, err)
	}
	end := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			end[o.Partition] = o.Offset
		}
	})
	// Partitions named directly: no wait for the consumer to discover the
	// topic.
	from := map[int32]kgo.Offset{}
	for p := range end {
		from[p] = kgo.NewOffset().AtStart()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	byPart := map[int32][]kafkaRecord{}
	reached := func() bool {
		for p, e := range end {
			if rs := byPart[p]; len(rs) == 0 || rs[len(rs)-1].offset+1 < e {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(2 * time.Minute); !reached(); {
		if time.Now().After(deadline) {
			t.Fatalf("reading %s: not at the end offsets %v after 2 minutes", topic, end)
		}
		// A poll's end cancels its fetch; a short one, with a fetch slowed
		// by the race detector in kfake, would start the read over.
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, hh := range r.Headers {
				h[hh.Key] = string(hh.Value)
			}
			byPart[r.Partition] = append(byPart[r.Partition], kafkaRecord{partition: r.Partition, offset: r.Offset, key: string(r.Key),
				value: r.Value, headers: h, producerID: r.ProducerID})
		})
	}
	var out []kafkaRecord
	for _, p := range slices.Sorted(maps.Keys(byPart)) {
		out = append(out, byPart[p]...)
	}
	return out
}

// TestLeaseSessionKilledKafkaSink is TestLeaseSessionKilledWithStandby
// with --sink kafka (an in-process kfake cluster): at least once, every
// committed event in Kafka, the first copies in per-key order, nothing
// rolled back; and no two relays ever publish at once: in each partition,
// every producer's records are one run, no record of a producer follows
// another producer's (each sink session is a new idempotent producer).
func TestLeaseSessionKilledKafkaSink(t *testing.T) {
	e := newEnv(t)
	ledger := e2e.NewLedger()
	cluster := kafkatest.Start(t)
	kafkaArgs := func() []string {
		return []string{"--sink", "kafka", "--kafka-brokers", strings.Join(cluster.Addrs(), ","), "--kafka-create-topics",
			"--kafka-topic-partitions", "8", "--data-dir", e2e.DataDir(t), "--kafka-dial-timeout", "3s"}
	}
	a, b := e.newNode("a", kafkaArgs()...), e.newNode("b", kafkaArgs()...)
	firstEpoch := killLeaderSessionsUnderLoad(t, e, ledger, 250, 100*time.Millisecond, a, b)
	began := time.Now()
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	drained := time.Since(began)
	takeovers := e.epoch() - firstEpoch
	a.stop()
	b.stop()
	stopped := time.Since(began)
	records := readKafka(t, cluster.Addrs(), "orders")
	t.Logf("drained %v, stopped %v, read back %v after the writers stopped", drained.Round(time.Millisecond), stopped.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	copies := map[string]int{}
	lastSeq := map[string]int{}
	lastProducer := map[int32]kafkaRecord{}
	// ended holds, per partition, the producers another one has followed.
	ended := map[int32]map[int64]bool{}
	producers := map[int64]bool{}
	bad, dups := 0, 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range records {
		producers[r.producerID] = true
		if prev, ok := lastProducer[r.partition]; ok && r.producerID != prev.producerID {
			if ended[r.partition] == nil {
				ended[r.partition] = map[int64]bool{}
			}
			ended[r.partition][prev.producerID] = true
			if ended[r.partition][r.producerID] {
				fail("partition %d: offset %d written by producer %d, which an other producer had followed before offset %d: two relays published at once",
					r.partition, r.offset, r.producerID, prev.offset)
			}
		}
		lastProducer[r.partition] = r
		var p e2e.Payload
		if err := json.Unmarshal(r.value, &p); err != nil {
			fail("%d@%d: %q is not a test payload", r.partition, r.offset, r.value)
			continue
		}
		if ledger.RolledBack[p.ID] {
			fail("event %s of a rolled-back transaction is in Kafka", p.ID)
		}
		if r.key != p.Key || r.headers["relay-event-id"] == "" {
			fail("event %s: key %q, headers %v", p.ID, r.key, r.headers)
		}
		if copies[p.ID]++; copies[p.ID] > 1 {
			dups++
			continue
		}
		if last, ok := lastSeq[p.Key]; ok && p.Seq <= last {
			fail("key %s: seq %d (%s) after seq %d", p.Key, p.Seq, p.ID, last)
		}
		lastSeq[p.Key] = p.Seq
	}
	e2e.CheckCommitted(t, ledger, copies, bad, len(records), "Kafka")
	t.Logf("at least once: %d committed events in %d records (%d duplicates) through 6 rounds of killed sessions, %d takeovers; %d producers, never two in one partition at once",
		len(ledger.Committed), len(records), dups, takeovers, len(producers))
}
