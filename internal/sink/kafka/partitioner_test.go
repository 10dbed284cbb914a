package kafka

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// TestPartitionerKnownAnswers: the partitioner the sink gives its client
// puts a key where Kafka's Java client does, toPositive(murmur2(key)) %
// partitions, with the hashes of Kafka's UtilsTest.testMurmur2; a keyless
// record where its event id would go; and a keyless record without one on
// the partition the embedded broker gives it.
func TestPartitionerKnownAnswers(t *testing.T) {
	t.Parallel()
	javaMurmur2 := []struct {
		key  string
		hash int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	}
	tp := partitioner().ForTopic("orders")
	for _, v := range javaMurmur2 {
		for _, n := range []int{1, 3, 8, 50, 1000} {
			want := int((uint32(v.hash) & 0x7fffffff) % uint32(n))
			keyed := &kgo.Record{Key: []byte(v.key), Headers: []kgo.RecordHeader{{Key: relay.HeaderEventID, Value: []byte("other")}}}
			if !tp.RequiresConsistency(keyed) {
				t.Fatal("the partitioner lets the client move a record")
			}
			if got := tp.Partition(keyed, n); got != want {
				t.Errorf("key %q of %d partitions on %d, Kafka's default partitioner says %d", v.key, n, got, want)
			}
			keyless := &kgo.Record{Headers: []kgo.RecordHeader{{Key: relay.HeaderEventID, Value: []byte("row's own")}, {Key: relay.HeaderEventID, Value: []byte(v.key)}}}
			if got := tp.Partition(keyless, n); got != want {
				t.Errorf("keyless record with event id %q of %d partitions on %d, want %d", v.key, n, got, want)
			}
		}
	}
	for _, n := range []int{1, 3, 8, 50} {
		for range 3 {
			if got, want := tp.Partition(&kgo.Record{Value: []byte("v")}, n), int(broker.PartitionForKey(nil, int32(n))); got != want {
				t.Errorf("keyless record without an event id of %d partitions on %d, the embedded broker puts it on %d", n, got, want)
			}
		}
	}
}
