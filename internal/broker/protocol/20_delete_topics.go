package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// deleteTopicNames are the topics a DeleteTopics request names: by name
// (every version), or from v6 by topic id, which is resolved here.
func (s *Server) deleteTopicNames(req *kmsg.DeleteTopicsRequest) []kmsg.DeleteTopicsRequestTopic {
	if req.Version < 6 {
		out := make([]kmsg.DeleteTopicsRequestTopic, 0, len(req.TopicNames))
		for _, n := range req.TopicNames {
			t := kmsg.NewDeleteTopicsRequestTopic()
			t.Topic = &n
			out = append(out, t)
		}
		return out
	}
	out := make([]kmsg.DeleteTopicsRequestTopic, 0, len(req.Topics))
	for _, t := range req.Topics {
		if t.Topic == nil {
			for _, ti := range s.b.Topics() {
				if topicID(ti.Name) == t.TopicID {
					name := ti.Name
					t.Topic = &name
				}
			}
		}
		out = append(out, t)
	}
	return out
}

// handleDeleteTopics deletes topics and their records (see
// broker.DeleteTopic: the name can be created again after a restart).
func (s *Server) handleDeleteTopics(req *kmsg.DeleteTopicsRequest, resp *kmsg.DeleteTopicsResponse) {
	for _, rt := range s.deleteTopicNames(req) {
		t := kmsg.NewDeleteTopicsResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		if rt.Topic == nil {
			t.ErrorCode = kerr.UnknownTopicID.Code
			resp.Topics = append(resp.Topics, t)
			continue
		}
		t.TopicID = topicID(*rt.Topic)
		if err := s.b.DeleteTopic(*rt.Topic); err != nil {
			t.ErrorCode = broker.KafkaErrorCode(err)
			msg := err.Error()
			t.ErrorMessage = &msg
		} else {
			s.log.Warn("deleted topic", "topic", *rt.Topic)
		}
		resp.Topics = append(resp.Topics, t)
	}
}
