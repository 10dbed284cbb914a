package kafka

import (
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/recordsize"
	"github.com/outboxrelay/relay/internal/topicname"
	"github.com/outboxrelay/relay/relay"
)

// partitioner places each record with the embedded broker's partitioner,
// broker.PartitionForKey: Kafka's default for keyed records (murmur2 of
// the key, made positive, modulo the partition count), so a key lands on
// the partition number the embedded broker and Kafka's Java client give
// it. A keyless record is placed by the murmur2 of its event id, as the
// embedded broker does: it has no order to keep, and a re-delivered event
// lands where its first copy did. A keyless record without an event id
// (never from the core) is placed as the embedded broker places it, by the
// murmur2 of no bytes: always the same partition.
func partitioner() kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(string) func(*kgo.Record, int) int {
		return func(r *kgo.Record, n int) int {
			key := r.Key
			if key == nil {
				key = eventID(r.Headers)
			}
			return int(broker.PartitionForKey(key, int32(n)))
		}
	})
}

// eventID returns the relay's event id header; the core appends its
// headers after the row's own, so the last one with the name is the
// relay's.
func eventID(hs []kgo.RecordHeader) []byte {
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].Key == relay.HeaderEventID {
			return hs[i].Value
		}
	}
	return nil
}

func toRecord(m relay.Message) *kgo.Record {
	r := &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
	if len(m.Headers) > 0 {
		r.Headers = make([]kgo.RecordHeader, len(m.Headers))
		for i, h := range m.Headers {
			r.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
	}
	return r
}

// recordBatchSize bounds from above the size of a record batch holding m
// alone, as the client and the broker measure it before compression: the
// v2 batch header, the produce request's array length, and the record
// with its varints at their actual lengths, plus a few bytes of slack so
// that a record the sink admits is never one the client refuses.
func recordBatchSize(m relay.Message) int {
	body := 1 + 1 + 1 // attributes, timestamp delta 0, offset delta 0
	body += recordsize.Bytes(m.Key) + recordsize.Bytes(m.Value)
	body += recordsize.Varint(int64(len(m.Headers)))
	for _, h := range m.Headers {
		body += recordsize.Varint(int64(len(h.Key))) + len(h.Key) + recordsize.Bytes(h.Value)
	}
	return 61 + 4 + recordsize.Varint(int64(body)) + body + 8
}

// validTopic applies Kafka's topic name rules.
func validTopic(name string) error {
	if err := topicname.Check(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTopic, err)
	}
	return nil
}
