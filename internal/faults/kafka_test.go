package faults_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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
	var out []kafkaRecord
	for _, r := range kafkatest.ReadRecords(t, brokers, topic, false) {
		h := map[string]string{}
		for _, hh := range r.Headers {
			h[hh.Key] = string(hh.Value)
		}
		out = append(out, kafkaRecord{partition: r.Partition, offset: r.Offset, key: string(r.Key),
			value: r.Value, headers: h, producerID: r.ProducerID})
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
	dups := 0
	violations := e2e.NewViolations(t)
	fail := violations.Errorf
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
	e2e.CheckCommitted(t, ledger, copies, violations, len(records), "Kafka")
	t.Logf("at least once: %d committed events in %d records (%d duplicates) through 6 rounds of killed sessions, %d takeovers; %d producers, never two in one partition at once",
		len(ledger.Committed), len(records), dups, takeovers, len(producers))
}
