package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/topicname"
)

// offsetsTopicPartitions is the partition count __consumer_offsets is
// listed with: one, empty (offsetsTopicMetadata).
const offsetsTopicPartitions = 1

// isOffsetsTopic reports whether topic is __consumer_offsets, which the
// server answers itself, empty and read-only, rather than from the log.
func isOffsetsTopic(topic string) bool { return topic == topicname.ConsumerOffsets }

// offsetsTopicFetch answers a fetch of __consumer_offsets: nothing, from a
// log that starts and ends at 0; an offset past it is out of range.
func offsetsTopicFetch(rp kmsg.FetchRequestTopicPartition, p *kmsg.FetchResponseTopicPartition) {
	switch {
	case rp.Partition < 0 || rp.Partition >= offsetsTopicPartitions:
		p.ErrorCode = kerr.UnknownTopicOrPartition.Code
	case rp.FetchOffset != 0:
		p.ErrorCode = kerr.OffsetOutOfRange.Code
		p.HighWatermark, p.LastStableOffset, p.LogStartOffset = 0, 0, 0
	default:
		p.HighWatermark, p.LastStableOffset, p.LogStartOffset = 0, 0, 0
	}
}

// offsetsTopicListOffset answers ListOffsets on __consumer_offsets as on
// an empty partition: earliest, latest and earliest-local are 0; the
// largest timestamp, latest-tiered and any time find nothing (-1).
func offsetsTopicListOffset(rp kmsg.ListOffsetsRequestTopicPartition, p *kmsg.ListOffsetsResponseTopicPartition) int16 {
	if rp.Partition < 0 || rp.Partition >= offsetsTopicPartitions {
		return kerr.UnknownTopicOrPartition.Code
	}
	switch rp.Timestamp {
	case listEarliest, listLatest, listEarliestLocal:
		p.Offset = 0
	case listMaxTime, listLatestTiered:
		p.LeaderEpoch = -1
	default:
		if rp.Timestamp < 0 {
			return kerr.InvalidRequest.Code
		}
		p.LeaderEpoch = -1
	}
	return 0
}
