package protocol

import (
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ListOffsets special timestamps.
const (
	listLatest   = -1
	listEarliest = -2
	listMaxTime  = -3
)

// handleListOffsets answers earliest (-2: the log start offset), latest
// (-1: the high watermark; under read_committed the last stable offset)
// and, for a timestamp, the first offset whose
// record is at least that recent (-1 when none is), from the time index.
// The max-timestamp query (-3) is not supported.
func (s *Server) handleListOffsets(req *kmsg.ListOffsetsRequest, resp *kmsg.ListOffsetsResponse) {
	for _, rt := range req.Topics {
		t := kmsg.NewListOffsetsResponseTopic()
		t.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			p := kmsg.NewListOffsetsResponseTopicPartition()
			p.Partition = rp.Partition
			p.Offset, p.Timestamp, p.LeaderEpoch = -1, -1, 0
			p.ErrorCode = s.listOffset(rt.Topic, rp, req.IsolationLevel == 1, &p)
			if p.ErrorCode != 0 {
				p.LeaderEpoch = -1
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
}

func (s *Server) listOffset(topic string, rp kmsg.ListOffsetsRequestTopicPartition, committed bool, p *kmsg.ListOffsetsResponseTopicPartition) int16 {
	if rp.CurrentLeaderEpoch > 0 {
		return kerr.UnknownLeaderEpoch.Code
	}
	switch ts := rp.Timestamp; ts {
	case listEarliest, listLatest:
		earliest, latest, err := s.b.Offsets(topic, rp.Partition)
		if err != nil {
			return broker.KafkaErrorCode(err)
		}
		p.Offset = latest
		if ts == listEarliest {
			p.Offset = earliest
		} else if committed {
			if p.Offset, err = s.b.LastStableOffset(topic, rp.Partition); err != nil {
				return broker.KafkaErrorCode(err)
			}
		}
		return 0
	case listMaxTime:
		return kerr.UnsupportedVersion.Code
	default:
		if ts < 0 {
			return kerr.InvalidRequest.Code
		}
		off, at, err := s.b.OffsetForTime(topic, rp.Partition, time.UnixMilli(ts))
		if err != nil {
			return broker.KafkaErrorCode(err)
		}
		p.Offset, p.Timestamp = off, at
		if off < 0 {
			p.LeaderEpoch = -1
		}
		return 0
	}
}
