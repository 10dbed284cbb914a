package protocol

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// handleDeleteGroups deletes groups with no members: their committed
// offsets are deleted durably (broker.DeleteOffsets). A group with
// members gets NON_EMPTY_GROUP, one never seen GROUP_ID_NOT_FOUND.
func (c *coordinator) handleDeleteGroups(req *kmsg.DeleteGroupsRequest, resp *kmsg.DeleteGroupsResponse) {
	for _, id := range req.Groups {
		r := kmsg.NewDeleteGroupsResponseGroup()
		r.Group = id
		code, err := c.deleteGroup(id)
		r.ErrorCode = code
		if err != nil && req.Version >= 3 {
			msg := err.Error()
			r.ErrorMessage = &msg
		}
		resp.Groups = append(resp.Groups, r)
	}
}

func (c *coordinator) deleteGroup(id string) (int16, error) {
	if share, code, err := c.s.share.deleteGroup(id); share {
		return code, err
	}
	if c.isConsumerGroup(id) {
		return kerr.NonEmptyGroup.Code, fmt.Errorf("consumer group %s has members", id)
	}
	live := false
	if g := c.lockGroup(id, false); g != nil {
		if len(g.members) > 0 || len(g.pending) > 0 {
			g.mu.Unlock()
			return kerr.NonEmptyGroup.Code, fmt.Errorf("group %s has members", id)
		}
		live = true
		defer g.mu.Unlock()
		defer c.retire(g)
	}
	if _, known := slices.BinarySearch(c.s.b.Groups(), id); !known && !live {
		return kerr.GroupIDNotFound.Code, fmt.Errorf("group %s has no members and no committed offsets", id)
	}
	n, err := c.s.b.DeleteOffsets(id, nil)
	if err != nil {
		return broker.KafkaErrorCode(err), err
	}
	c.s.log.Info("deleted group", "group", id, "offsets", n)
	return 0, nil
}

// handleOffsetDelete deletes a group's committed offsets of the partitions
// named. A partition of a topic the group's live members subscribe to is
// refused with GROUP_SUBSCRIBED_TO_TOPIC, as Kafka does.
func (c *coordinator) handleOffsetDelete(req *kmsg.OffsetDeleteRequest, resp *kmsg.OffsetDeleteResponse) {
	subscribed := map[string]bool{}
	if g := c.lockGroup(req.Group, false); g != nil {
		for _, m := range g.members {
			for _, t := range m.subscribedTopics() {
				subscribed[t] = true
			}
		}
		g.mu.Unlock()
	} else if cg, _ := c.lockConsumerGroup(req.Group, false); cg != nil {
		for _, t := range cg.partitionsSubscribed() {
			subscribed[t] = true
		}
		cg.mu.Unlock()
	} else if _, known := slices.BinarySearch(c.s.b.Groups(), req.Group); !known {
		resp.ErrorCode = kerr.GroupIDNotFound.Code
		return
	}
	var parts []broker.TopicPartition
	for _, rt := range req.Topics {
		t := kmsg.NewOffsetDeleteResponseTopic()
		t.Topic = rt.Topic
		for _, rp := range rt.Partitions {
			p := kmsg.NewOffsetDeleteResponseTopicPartition()
			p.Partition = rp.Partition
			if subscribed[rt.Topic] {
				p.ErrorCode = kerr.GroupSubscribedToTopic.Code
			} else {
				parts = append(parts, broker.TopicPartition{Topic: rt.Topic, Partition: rp.Partition})
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	if len(parts) > 0 {
		if _, err := c.s.b.DeleteOffsets(req.Group, parts); err != nil {
			code := broker.KafkaErrorCode(err)
			for i := range resp.Topics {
				for j := range resp.Topics[i].Partitions {
					if resp.Topics[i].Partitions[j].ErrorCode == 0 {
						resp.Topics[i].Partitions[j].ErrorCode = code
					}
				}
			}
		}
	}
}

// subscribedTopics are the topics in the member's consumer subscription
// (its first protocol's metadata); none for other protocol types.
func (m *member) subscribedTopics() []string {
	if m.protocolType != "consumer" || len(m.protocols) == 0 {
		return nil
	}
	var meta kmsg.ConsumerMemberMetadata
	if err := meta.ReadFrom(m.protocols[0].Metadata); err != nil {
		return nil
	}
	return meta.Topics
}
