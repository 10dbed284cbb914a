package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// handleDeleteRecords moves partitions' log starts up (broker.DeleteRecords:
// durable before the answer; -1 is the high watermark) and answers each
// with its new log start.
func (s *Server) handleDeleteRecords(req *kmsg.DeleteRecordsRequest, resp *kmsg.DeleteRecordsResponse) {
	for _, rt := range req.Topics {
		t := kmsg.NewDeleteRecordsResponseTopic()
		t.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			p := kmsg.NewDeleteRecordsResponseTopicPartition()
			p.Partition, p.LowWatermark = rp.Partition, -1
			start, err := s.b.DeleteRecords(rt.Topic, rp.Partition, rp.Offset)
			if err != nil {
				p.ErrorCode = broker.KafkaErrorCode(err)
			} else {
				p.LowWatermark = start
				s.log.Info("deleted records", "topic", rt.Topic, "partition", rp.Partition, "log_start", start)
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
}
