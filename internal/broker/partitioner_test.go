package broker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestMurmur2KnownAnswers checks the partitioner's hash against the
// vectors of Apache Kafka's own UtilsTest.testMurmur2 (the Java client's
// Utils.murmur2), so keys land where Kafka's default partitioner puts them.
func TestMurmur2KnownAnswers(t *testing.T) {
	for key, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := int32(murmur2([]byte(key))); got != want {
			t.Errorf("murmur2(%q) = %d, Kafka's is %d", key, got, want)
		}
	}
	// toPositive(-790332482) = 1357151166, and 1357151166 % 50 = 16.
	if p := PartitionForKey([]byte("foobar"), 50); p != 16 {
		t.Errorf("foobar of 50 partitions on %d, Kafka's default partitioner says 16", p)
	}
}

// TestPartitionForKeyMatchesFranzGo: a franz-go producer with its default
// partitioner puts a key where the relay does.
func TestPartitionForKeyMatchesFranzGo(t *testing.T) {
	t.Parallel()
	part := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for n := 1; n <= 64; n *= 2 {
		for i := 0; i < 200; i++ {
			key := []byte(fmt.Sprintf("order-%d", i*7919))
			if i%50 == 0 {
				key = []byte(strings.Repeat("x", i/50))
			}
			want := part.Partition(&kgo.Record{Key: key}, n+n/3)
			if got := PartitionForKey(key, int32(n+n/3)); int(got) != want {
				t.Fatalf("key %q n %d: got %d, franz-go %d", key, n+n/3, got, want)
			}
		}
	}
}
