package protocol

import (
	"sync"

	"github.com/outboxrelay/relay/internal/topicname"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Fetch v13+ names topics by id (KIP-516), the ids Metadata v10+ reports:
// derived from the names (topicID), so an id always stands for one name.
// fetchTopicIDs puts the name back in each topic of such a request and
// takes out those whose id no topic has, returning their answer
// (UNKNOWN_TOPIC_ID for each partition, as Kafka answers); forgotten
// topics of an incremental fetch are resolved the same way (an unknown one
// is dropped: nothing of it is in the session). A topic deleted and
// created again has the same id, as it has the same name in older
// versions.

// topicNames maps the ids handed out to their names. Ids are a function of
// names, so an entry never goes stale; one missing is looked up among the
// broker's topics.
var topicNames sync.Map

// topicName is the name of the topic with id, if any has it.
func (s *Server) topicName(id [16]byte) (string, bool) {
	if name, ok := topicNames.Load(id); ok {
		return name.(string), true
	}
	names := []string{topicname.ConsumerOffsets}
	for _, ti := range s.b.Topics() {
		names = append(names, ti.Name)
	}
	found := ""
	for _, name := range names {
		tid := topicID(name)
		topicNames.Store(tid, name)
		if tid == id {
			found = name
		}
	}
	return found, found != ""
}

func (s *Server) fetchTopicIDs(req *kmsg.FetchRequest) (unknown []kmsg.FetchResponseTopic) {
	if req.Version < 13 {
		return nil
	}
	known := make([]kmsg.FetchRequestTopic, 0, len(req.Topics))
	for _, rt := range req.Topics {
		name, ok := s.topicName(rt.TopicID)
		if ok {
			rt.Topic = name
			known = append(known, rt)
			continue
		}
		t := kmsg.NewFetchResponseTopic()
		t.TopicID = rt.TopicID
		for _, rp := range rt.Partitions {
			p := kmsg.NewFetchResponseTopicPartition()
			p.Partition, p.ErrorCode = rp.Partition, kerr.UnknownTopicID.Code
			p.HighWatermark, p.LastStableOffset, p.LogStartOffset = -1, -1, -1
			t.Partitions = append(t.Partitions, p)
		}
		unknown = append(unknown, t)
	}
	req.Topics = known
	forgotten := req.ForgottenTopics[:0:0]
	for _, ft := range req.ForgottenTopics {
		if name, ok := s.topicName(ft.TopicID); ok {
			ft.Topic = name
			forgotten = append(forgotten, ft)
		}
	}
	req.ForgottenTopics = forgotten
	return unknown
}
