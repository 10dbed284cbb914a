package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
)

// kafkaBroker is a client of the relay's Kafka listener, talking to its
// one broker directly.
type kafkaBroker struct {
	t   *testing.T
	cl  *kgo.Client
	b   *kgo.Broker
	ids map[string][16]byte // topic ids, for Fetch v13 and later
}

func dialKafka(t *testing.T, addr string) *kafkaBroker {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	md, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil || len(md.Brokers) != 1 {
		t.Fatalf("metadata: %v (%d brokers)", err, len(md.Brokers))
	}
	ids := map[string][16]byte{}
	for _, mt := range md.Topics {
		if mt.Topic != nil {
			ids[*mt.Topic] = mt.TopicID
		}
	}
	return &kafkaBroker{t: t, cl: cl, b: cl.Broker(int(md.Brokers[0].NodeID)), ids: ids}
}

// lastBatch fetches partition p of topic and returns the header of its
// last batch.
func (k *kafkaBroker) lastBatch(topic string, p int32) broker.BatchHeader {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var last broker.BatchHeader
	found := false
	for off := int64(0); ; {
		req := kmsg.NewPtrFetchRequest()
		req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = -1, 100, 1, 16<<20
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = topic, k.ids[topic] // the name up to v12, the id from v13
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes, rp.LogStartOffset = p, off, 16<<20, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		raw, err := k.b.Request(ctx, req)
		if err != nil {
			k.t.Fatalf("fetch %s/%d@%d: %v", topic, p, off, err)
		}
		resp := raw.(*kmsg.FetchResponse)
		fp := resp.Topics[0].Partitions[0]
		if fp.ErrorCode != 0 {
			k.t.Fatalf("fetch %s/%d@%d: %v", topic, p, off, kerr.ErrorForCode(fp.ErrorCode))
		}
		next := off
		for b, err := range broker.Batches(fp.RecordBatches) {
			if err != nil {
				break // a partial batch at the end of the response
			}
			h, err := broker.ParseBatchHeader(b)
			if err != nil {
				k.t.Fatal(err)
			}
			last, found, next = h, true, h.LastOffset()+1
		}
		if next >= fp.HighWatermark {
			break
		}
		if next == off {
			k.t.Fatalf("fetch %s/%d@%d: no batch before the high watermark %d", topic, p, off, fp.HighWatermark)
		}
		off = next
	}
	if !found {
		k.t.Fatalf("%s/%d holds no batch", topic, p)
	}
	return last
}

// produce sends one batch to topic/p and returns the partition's error
// code.
func (k *kafkaBroker) produce(topic string, p int32, batch []byte) int16 {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 10000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Partition, rp.Records = p, batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	raw, err := k.b.Request(ctx, req)
	if err != nil {
		k.t.Fatalf("produce: %v", err)
	}
	return raw.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode
}

// TestProduceUnderTheRelaysProducerID: a Kafka client reads the relay's
// producer id and epoch from a batch it fetches, and sends Produce
// requests under that id, one with the next sequence and one with the next
// epoch, and asks for an epoch bump of that id. The produces are refused
// with INVALID_PRODUCER_ID_MAPPING, the bump does not hand out the relay's
// id, and the relay keeps publishing every event, before and after a
// restart. The topic is writable for clients (--listener-writable-topics):
// the check under test is the one behind the listener's ACLs.
func TestProduceUnderTheRelaysProducerID(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	kafkaAddr := e2e.FreeAddr(t)
	// By default the listener refuses a client's produce to the relay's
	// topics before any producer check (TOPIC_AUTHORIZATION_FAILED, see
	// TestACLsProduceToRelayTopicsRefused). Here the topic is made
	// writable, so that the forged produces reach the producer-id check
	// behind it: the defence that holds when an operator lets clients in.
	r := e.newNode("relay", "--kafka-addr", kafkaAddr, "--partitions", "4", "--listener-writable-topics", "orders").start()
	e2e.WaitReady(t, r.proc, true, 30*time.Second)
	if err := e2e.Write(ctx, e.writers(3000), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)

	k := dialKafka(t, kafkaAddr)
	forged := []broker.Record{{Key: []byte("key-1"), Value: []byte("forged"), Headers: []broker.Header{{Key: "relay-event-id", Value: []byte("00000000-0000-0000-0000-000000000001")}}}}
	for p := int32(0); p < 4; p++ {
		h := k.lastBatch("orders", p)
		if h.ProducerID < 0 {
			t.Fatalf("partition %d: the relay's batch has no producer id", p)
		}
		next := broker.EncodeBatch(h.ProducerID, h.ProducerEpoch, h.LastSequence()+1, forged)
		if code := k.produce("orders", p, next); code != kerr.InvalidProducerIDMapping.Code {
			t.Errorf("partition %d: produce as producer %d epoch %d with the next sequence %d: error %v, want INVALID_PRODUCER_ID_MAPPING",
				p, h.ProducerID, h.ProducerEpoch, h.LastSequence()+1, kerr.ErrorForCode(code))
		}
		bumped := broker.EncodeBatch(h.ProducerID, h.ProducerEpoch+1, 0, forged)
		if code := k.produce("orders", p, bumped); code != kerr.InvalidProducerIDMapping.Code {
			t.Errorf("partition %d: produce as producer %d with the next epoch %d: error %v, want INVALID_PRODUCER_ID_MAPPING",
				p, h.ProducerID, h.ProducerEpoch+1, kerr.ErrorForCode(code))
		}
		init := kmsg.NewPtrInitProducerIDRequest()
		init.TransactionTimeoutMillis, init.ProducerID, init.ProducerEpoch = 60000, h.ProducerID, h.ProducerEpoch
		raw, err := k.b.Request(ctx, init)
		if err != nil {
			t.Fatal(err)
		}
		if resp := raw.(*kmsg.InitProducerIDResponse); resp.ErrorCode == 0 && resp.ProducerID == h.ProducerID {
			t.Errorf("InitProducerID bumping the relay's producer %d handed it out (epoch %d)", resp.ProducerID, resp.ProducerEpoch)
		}
		if p == 0 {
			t.Logf("the relay writes as producer %d epoch %d; partition 0's last sequence is %d", h.ProducerID, h.ProducerEpoch, h.LastSequence())
		}
	}

	// The relay keeps publishing, and after a restart too.
	if err := e2e.Write(ctx, e.writers(3000), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	e2e.WaitReady(t, r.proc, true, 10*time.Second)
	r.stop()
	r.start()
	if err := e2e.Write(ctx, e.writers(2000), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	r.stop()
	n := e.checkAll(ledger)
	checkEpochOrder(t, readBatches(t, e.dataDir, "orders"))
	t.Logf("%d events exactly once in per-key order; the forged produces were refused", n)
}
