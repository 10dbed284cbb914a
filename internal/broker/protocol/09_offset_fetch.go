package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleOffsetFetch returns committed offsets (-1 where none), for the
// named partitions or, when topics are null, for everything the group
// committed. v8+ asks for several groups at once. With require_stable
// (v7+), a partition whose offset an open transaction is about to commit
// answers UNSTABLE_OFFSET_COMMIT, which the client retries, so that a
// consumer taking over does not start from the offset before it.
func (s *Server) handleOffsetFetch(req *kmsg.OffsetFetchRequest, resp *kmsg.OffsetFetchResponse) {
	if req.Version >= 8 {
		for _, rg := range req.Groups {
			g := kmsg.NewOffsetFetchResponseGroup()
			g.Group = rg.Group
			var topics []kmsg.OffsetFetchRequestTopic
			if rg.Topics != nil {
				topics = make([]kmsg.OffsetFetchRequestTopic, 0, len(rg.Topics))
				for _, t := range rg.Topics {
					topics = append(topics, kmsg.OffsetFetchRequestTopic{Topic: t.Topic, Partitions: t.Partitions})
				}
			}
			for _, t := range s.committed(rg.Group, topics, req.RequireStable) {
				gt := kmsg.NewOffsetFetchResponseGroupTopic()
				gt.Topic = t.Topic
				for _, p := range t.Partitions {
					gp := kmsg.NewOffsetFetchResponseGroupTopicPartition()
					gp.Partition, gp.Offset, gp.LeaderEpoch, gp.Metadata, gp.ErrorCode = p.Partition, p.Offset, p.LeaderEpoch, p.Metadata, p.ErrorCode
					gt.Partitions = append(gt.Partitions, gp)
				}
				g.Topics = append(g.Topics, gt)
			}
			resp.Groups = append(resp.Groups, g)
		}
		return
	}
	topics := req.Topics
	if req.Version < 2 && topics == nil {
		topics = []kmsg.OffsetFetchRequestTopic{}
	}
	resp.Topics = s.committed(req.Group, topics, req.Version >= 7 && req.RequireStable)
}

// committed answers one group's offsets; nil topics means all.
func (s *Server) committed(group string, topics []kmsg.OffsetFetchRequestTopic, stable bool) []kmsg.OffsetFetchResponseTopic {
	var out []kmsg.OffsetFetchResponseTopic
	partition := func(topic string, part int32) kmsg.OffsetFetchResponseTopicPartition {
		p := kmsg.NewOffsetFetchResponseTopicPartition()
		p.Partition, p.Offset, p.LeaderEpoch = part, -1, -1
		empty := ""
		p.Metadata = &empty
		if stable && s.b.TxnOffsetsPending(group, topic, part) {
			p.ErrorCode = kerr.UnstableOffsetCommit.Code
			return p
		}
		if c, ok := s.b.FetchOffset(group, topic, part); ok {
			md := c.Metadata
			p.Offset, p.LeaderEpoch, p.Metadata = c.Offset, c.LeaderEpoch, &md
		}
		return p
	}
	if topics == nil {
		byTopic := map[string]int{}
		for _, o := range s.b.GroupOffsets(group) {
			i, ok := byTopic[o.Topic]
			if !ok {
				i = len(out)
				byTopic[o.Topic] = i
				t := kmsg.NewOffsetFetchResponseTopic()
				t.Topic = o.Topic
				out = append(out, t)
			}
			out[i].Partitions = append(out[i].Partitions, partition(o.Topic, o.Partition))
		}
		return out
	}
	for _, rt := range topics {
		t := kmsg.NewOffsetFetchResponseTopic()
		t.Topic = rt.Topic
		for _, part := range rt.Partitions {
			t.Partitions = append(t.Partitions, partition(rt.Topic, part))
		}
		out = append(out, t)
	}
	return out
}
