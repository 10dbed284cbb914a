package protocol

import (
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ListOffsets special timestamps.
const (
	listLatest         = -1
	listEarliest       = -2
	listMaxTime        = -3 // v7+, KIP-734
	listEarliestLocal  = -4 // v8+, KIP-405
	listLatestTiered   = -5 // v9+, KIP-1005
	listEarliestUpload = -6 // v11+, KIP-1023: not advertised
)

// handleListOffsets answers every version it advertises (0 to 10) as
// Kafka does:
//   - earliest (-2): the log start offset;
//   - latest (-1): the high watermark, under read_committed the last
//     stable offset;
//   - max-timestamp (-3, v7+): the offset and timestamp of the record with
//     the largest timestamp (the first one if several share it), -1 when
//     the partition holds none or, under read_committed, when it is not
//     yet below the last stable offset;
//   - earliest-local (-4, v8+): the log start offset with its
//     timestamp -1, as a broker without tiered storage answers (its local
//     log is all of it);
//   - latest-tiered (-5, v9+): -1, as a broker without tiered storage
//     answers (nothing is in remote storage);
//   - a timestamp: the first offset whose record is at least that recent
//     (-1 when none is), from the time index.
//
// Version 0 (which Burrow's offset refresh sends) answers a list of at
// most one offset, the one above, where Kafka's lists up to MaxNumOffsets
// segment base offsets for a timestamp: earliest and latest are the same
// in both; for a time the list holds the first offset at least that
// recent rather than segment starts before it.
//
// Version 10's timeout bounds a remote-storage lookup; with none, every
// answer is immediate. A special timestamp below the version that defines
// it, or an unknown negative one, is refused with INVALID_REQUEST per
// partition; v11's -6 (earliest pending upload, KIP-1023) is not
// advertised.
func (s *Server) handleListOffsets(req *kmsg.ListOffsetsRequest, resp *kmsg.ListOffsetsResponse) {
	for _, rt := range req.Topics {
		t := kmsg.NewListOffsetsResponseTopic()
		t.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			p := kmsg.NewListOffsetsResponseTopicPartition()
			p.Partition = rp.Partition
			p.Offset, p.Timestamp, p.LeaderEpoch = -1, -1, 0
			p.ErrorCode = s.listOffset(rt.Topic, rp, req.Version, req.IsolationLevel == 1, &p)
			if p.ErrorCode != 0 {
				p.LeaderEpoch = -1
			}
			if req.Version == 0 {
				p.OldStyleOffsets = []int64{}
				if p.ErrorCode == 0 && p.Offset >= 0 && rp.MaxNumOffsets > 0 {
					p.OldStyleOffsets = append(p.OldStyleOffsets, p.Offset)
				}
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
}

// specialSince is the first ListOffsets version defining each special
// timestamp beyond latest and earliest.
var specialSince = map[int64]int16{listMaxTime: 7, listEarliestLocal: 8, listLatestTiered: 9}

func (s *Server) listOffset(topic string, rp kmsg.ListOffsetsRequestTopicPartition, version int16, committed bool, p *kmsg.ListOffsetsResponseTopicPartition) int16 {
	if rp.CurrentLeaderEpoch > 0 {
		return kerr.UnknownLeaderEpoch.Code
	}
	if since, ok := specialSince[rp.Timestamp]; ok && version < since {
		return kerr.InvalidRequest.Code
	}
	if isOffsetsTopic(topic) {
		return s.offsets.listOffset(rp, p)
	}
	switch ts := rp.Timestamp; ts {
	case listEarliest, listLatest, listEarliestLocal:
		earliest, latest, err := s.b.Offsets(topic, rp.Partition)
		if err != nil {
			return broker.KafkaErrorCode(err)
		}
		p.Offset = latest
		if ts != listLatest {
			p.Offset = earliest
		} else if committed {
			if p.Offset, err = s.b.LastStableOffset(topic, rp.Partition); err != nil {
				return broker.KafkaErrorCode(err)
			}
		}
		return 0
	case listLatestTiered:
		if _, _, err := s.b.Offsets(topic, rp.Partition); err != nil {
			return broker.KafkaErrorCode(err)
		}
		p.LeaderEpoch = -1
		return 0
	case listMaxTime:
		off, at, err := s.b.MaxTimestamp(topic, rp.Partition)
		if err != nil {
			return broker.KafkaErrorCode(err)
		}
		if off >= 0 && committed {
			lso, err := s.b.LastStableOffset(topic, rp.Partition)
			if err != nil {
				return broker.KafkaErrorCode(err)
			}
			if off >= lso {
				off, at = -1, -1
			}
		}
		p.Offset, p.Timestamp = off, at
		if off < 0 {
			p.LeaderEpoch = -1
		}
		return 0
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
