package protocol

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestAppendFetchResponse checks the copy-free fetch encoding against
// kmsg's for every fetch version the server offers.
func TestAppendFetchResponse(t *testing.T) {
	t.Parallel()
	for v := int16(4); v <= supportedVersions[kmsg.Fetch.Int16()].max; v++ {
		resp := kmsg.NewPtrFetchResponse()
		resp.Version, resp.ThrottleMillis, resp.ErrorCode, resp.SessionID = v, 7, 0, 0
		for ti, name := range []string{"a", "topic-b"} {
			rt := kmsg.NewFetchResponseTopic()
			rt.Topic, rt.TopicID = name, topicID(name)
			for pi := range 3 {
				p := kmsg.NewFetchResponseTopicPartition()
				p.Partition = int32(pi)
				p.HighWatermark, p.LastStableOffset, p.LogStartOffset = 100, 100, int64(ti)
				switch pi {
				case 0:
					p.RecordBatches = bytes.Repeat([]byte{byte(ti + 1)}, 300)
				case 1:
					p.RecordBatches = []byte{}
				case 2:
					p.ErrorCode = 1
				}
				rt.Partitions = append(rt.Partitions, p)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		want := resp.AppendTo([]byte("prefix"))
		got, pieces, ok := appendFetchResponse([]byte("prefix"), resp)
		if !ok {
			t.Fatalf("v%d: not encoded", v)
		}
		var joined []byte
		at := 0
		for _, p := range pieces {
			joined = append(append(joined, got[at:p.end]...), p.batches...)
			at = p.end
		}
		joined = append(joined, got[at:]...)
		if !bytes.Equal(joined, want) {
			t.Fatalf("v%d: encoding differs from kmsg's:\n got %x\nwant %x", v, joined, want)
		}
		aborted := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
		resp.Topics[0].Partitions[0].AbortedTransactions = append(resp.Topics[0].Partitions[0].AbortedTransactions, aborted)
		if _, _, ok := appendFetchResponse(nil, resp); ok {
			t.Fatalf("v%d: encoded aborted transactions", v)
		}
	}
}
