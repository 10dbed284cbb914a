package protocol

import (
	"crypto/sha256"
	"errors"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/topicname"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// topicID derives a stable topic id from the name. The broker has no topic
// ids and cannot delete topics, so a name maps to one topic for good.
func topicID(name string) [16]byte {
	sum := sha256.Sum256([]byte("relay topic id\x00" + name))
	var id [16]byte
	copy(id[:], sum[:16])
	return id
}

func (s *Server) handleMetadata(c *conn, req *kmsg.MetadataRequest, resp *kmsg.MetadataResponse) {
	defer s.metadataOperations(c, req, resp)
	host, port := s.advertised(c.nc.LocalAddr())
	b := kmsg.NewMetadataResponseBroker()
	b.NodeID, b.Host, b.Port = nodeID, host, port
	resp.Brokers = []kmsg.MetadataResponseBroker{b}
	clusterID := s.cfg.ClusterID
	resp.ClusterID = &clusterID
	resp.ControllerID = nodeID

	all := req.Topics == nil || (req.Version == 0 && len(req.Topics) == 0)
	if all {
		for _, ti := range s.b.Topics() {
			if s.canTopic(c, kmsg.ACLOperationDescribe, ti.Name) {
				resp.Topics = append(resp.Topics, metadataTopic(ti))
			}
		}
		if s.canTopic(c, kmsg.ACLOperationDescribe, topicname.ConsumerOffsets) {
			resp.Topics = append(resp.Topics, offsetsTopicMetadata())
		}
		return
	}
	autoCreate := s.cfg.AutoCreateTopics && (req.Version < 4 || req.AllowAutoTopicCreation)
	var byID map[[16]byte]string
	for _, rt := range req.Topics {
		var name string
		switch {
		case rt.Topic != nil:
			name = *rt.Topic
		case rt.TopicID != [16]byte{}:
			if byID == nil {
				byID = map[[16]byte]string{}
				for _, ti := range s.b.Topics() {
					byID[topicID(ti.Name)] = ti.Name
				}
				byID[topicID(topicname.ConsumerOffsets)] = topicname.ConsumerOffsets
			}
			n, ok := byID[rt.TopicID]
			if !ok {
				t := kmsg.NewMetadataResponseTopic()
				t.TopicID = rt.TopicID
				t.ErrorCode = kerr.UnknownTopicID.Code
				resp.Topics = append(resp.Topics, t)
				continue
			}
			name = n
		}
		if !s.canTopic(c, kmsg.ACLOperationDescribe, name) {
			t := kmsg.NewMetadataResponseTopic()
			t.Topic = &name
			t.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, t)
			continue
		}
		if name == topicname.ConsumerOffsets {
			resp.Topics = append(resp.Topics, offsetsTopicMetadata())
			continue
		}
		ti, err := s.b.Topic(name)
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			if verr := broker.ValidateTopicName(name); verr != nil {
				err = verr
			} else if autoCreate && (s.canTopic(c, kmsg.ACLOperationCreate, name) || s.can(c, kmsg.ACLOperationCreate, kmsg.ACLResourceTypeCluster, clusterName)) {
				ti, err = s.b.EnsureTopic(name)
				if err == nil {
					s.log.Info("auto-created topic", "topic", name, "partitions", len(ti.Partitions))
				}
			}
		}
		if err != nil {
			t := kmsg.NewMetadataResponseTopic()
			t.Topic = &name
			t.ErrorCode = broker.KafkaErrorCode(err)
			resp.Topics = append(resp.Topics, t)
			continue
		}
		resp.Topics = append(resp.Topics, metadataTopic(ti))
	}
}

// offsetsTopicMetadata describes __consumer_offsets as Kafka lists it:
// internal, so that clients (regex subscriptions, admin tools) tell it from
// the users' topics. Group offsets live in the broker's own file, not in a
// topic: its one partition is served read-only and empty (ListOffsets
// answers 0, a Fetch from offset 0 waits and returns nothing, a Produce
// is refused with INVALID_TOPIC_EXCEPTION as Kafka refuses clients'
// appends to internal topics), and a KIP-848 regex resolved by the
// coordinator matches it, as Kafka's does (offsets_topic.go).
func offsetsTopicMetadata() kmsg.MetadataResponseTopic {
	t := metadataTopic(broker.TopicInfo{Name: topicname.ConsumerOffsets, Partitions: []broker.PartitionInfo{{Partition: 0}}})
	t.IsInternal = true
	return t
}

func metadataTopic(ti broker.TopicInfo) kmsg.MetadataResponseTopic {
	t := kmsg.NewMetadataResponseTopic()
	name := ti.Name
	t.Topic = &name
	t.TopicID = topicID(name)
	t.Partitions = make([]kmsg.MetadataResponseTopicPartition, 0, len(ti.Partitions))
	for _, p := range ti.Partitions {
		mp := kmsg.NewMetadataResponseTopicPartition()
		mp.Partition = p.Partition
		mp.Leader = nodeID
		mp.LeaderEpoch = 0
		mp.Replicas = []int32{nodeID}
		mp.ISR = []int32{nodeID}
		mp.OfflineReplicas = []int32{}
		t.Partitions = append(t.Partitions, mp)
	}
	return t
}
