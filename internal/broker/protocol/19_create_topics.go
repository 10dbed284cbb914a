package protocol

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleCreateTopics creates topics with a partition count (-1: the
// broker's default) and the configs the broker keeps
// (broker.TopicConfigNames). The replication factor must be -1 or 1 and manual
// replica assignments are refused: there is one node.
func (s *Server) handleCreateTopics(req *kmsg.CreateTopicsRequest, resp *kmsg.CreateTopicsResponse) {
	seen := timesNamed(req.Topics, func(rt kmsg.CreateTopicsRequestTopic) string { return rt.Topic })
	for _, rt := range req.Topics {
		t := kmsg.NewCreateTopicsResponseTopic()
		t.Topic = rt.Topic
		t.NumPartitions, t.ReplicationFactor = -1, -1
		fail := func(code int16, err error) {
			t.ErrorCode = code
			if err != nil {
				msg := err.Error()
				t.ErrorMessage = &msg
			}
		}
		cfg, err := topicConfig(rt)
		switch {
		case seen[rt.Topic] > 1:
			fail(kerr.InvalidRequest.Code, fmt.Errorf("topic %q named more than once", rt.Topic))
		case rt.ReplicationFactor != -1 && rt.ReplicationFactor != 1:
			fail(kerr.InvalidReplicationFactor.Code, fmt.Errorf("replication factor %d: the embedded broker has one node", rt.ReplicationFactor))
		case len(rt.ReplicaAssignment) > 0:
			fail(kerr.InvalidReplicaAssignment.Code, errors.New("manual replica assignment is not supported"))
		case rt.NumPartitions == 0 || rt.NumPartitions < -1:
			fail(kerr.InvalidPartitions.Code, fmt.Errorf("%d partitions", rt.NumPartitions))
		case err != nil:
			fail(kerr.InvalidConfig.Code, err)
		case req.ValidateOnly:
			if err := broker.ValidateTopicName(rt.Topic); err != nil {
				fail(broker.KafkaErrorCode(err), err)
			} else if _, err := s.b.Topic(rt.Topic); err == nil {
				fail(kerr.TopicAlreadyExists.Code, fmt.Errorf("topic %q already exists", rt.Topic))
			}
		default:
			ti, err := s.b.CreateTopic(rt.Topic, cfg)
			if err != nil {
				fail(broker.KafkaErrorCode(err), err)
				break
			}
			s.log.Info("created topic", "topic", ti.Name, "partitions", len(ti.Partitions))
			t.TopicID = topicID(ti.Name)
			t.NumPartitions, t.ReplicationFactor = int32(len(ti.Partitions)), 1
			t.Configs = describeTopicConfig(ti.Config)
		}
		resp.Topics = append(resp.Topics, t)
	}
}

// timesNamed counts how often a request names each topic (name of each
// entry): the admin APIs refuse a topic named more than once with
// INVALID_REQUEST, as Kafka does.
func timesNamed[E any](entries []E, name func(E) string) map[string]int {
	n := map[string]int{}
	for _, e := range entries {
		n[name(e)]++
	}
	return n
}

func topicConfig(rt kmsg.CreateTopicsRequestTopic) (broker.TopicConfig, error) {
	var cfg broker.TopicConfig
	if rt.NumPartitions > 0 {
		cfg.Partitions = rt.NumPartitions
	}
	for _, c := range rt.Configs {
		if c.Value == nil {
			continue
		}
		if err := setTopicConfig(&cfg, c.Name, *c.Value); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

func describeTopicConfig(c broker.TopicConfig) []kmsg.CreateTopicsResponseTopicConfig {
	entries := topicConfigEntries(c)
	out := make([]kmsg.CreateTopicsResponseTopicConfig, 0, len(entries))
	for _, e := range entries {
		rc := kmsg.NewCreateTopicsResponseTopicConfig()
		v := e.value
		rc.Name, rc.Value, rc.Source = e.name, &v, 5
		out = append(out, rc)
	}
	return out
}
