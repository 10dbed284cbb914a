package protocol

import (
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleConsumerGroupDescribe describes KIP-848 consumer groups: epochs,
// assignor, and each member's subscription, current and target
// assignment. An empty group known by its saved state or its offsets is
// Empty; a classic group, or an id never seen, gets GROUP_ID_NOT_FOUND, as
// in Kafka.
func (c *coordinator) handleConsumerGroupDescribe(req *kmsg.ConsumerGroupDescribeRequest, resp *kmsg.ConsumerGroupDescribeResponse) {
	for _, id := range req.Groups {
		dg := kmsg.NewConsumerGroupDescribeResponseGroup()
		dg.Group = id
		notFound := func(format string) {
			dg.ErrorCode = kerr.GroupIDNotFound.Code
			msg := fmt.Sprintf(format, id)
			dg.ErrorMessage = &msg
		}
		c.mu.Lock()
		g := c.cgroups[id]
		c.mu.Unlock()
		switch {
		case g != nil:
			g.mu.Lock()
			g.describe(&dg)
			g.mu.Unlock()
		case c.classicGroupHasMembers(id):
			notFound("Group %s is not a consumer group.")
		default:
			if sg, ok := c.savedConsumerGroup(id); ok {
				dg.State, dg.Epoch, dg.AssignmentEpoch, dg.AssignorName = "Empty", sg.GroupEpoch, sg.GroupEpoch, assignorUniform
				break
			}
			if _, found := slices.BinarySearch(c.s.b.Groups(), id); found {
				dg.State, dg.AssignorName = "Empty", assignorUniform
				break
			}
			notFound("Group %s not found.")
		}
		resp.Groups = append(resp.Groups, dg)
	}
}

func (g *cgroup) describe(dg *kmsg.ConsumerGroupDescribeResponseGroup) {
	dg.State, dg.Epoch, dg.AssignmentEpoch = g.state(), g.epoch, g.assignmentEpoch
	dg.AssignorName = g.assignor
	if dg.AssignorName == "" {
		dg.AssignorName = assignorUniform
	}
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range g.members {
			if !yield(id) {
				return
			}
		}
	}) {
		m := g.members[id]
		dm := kmsg.NewConsumerGroupDescribeResponseGroupMember()
		dm.MemberID, dm.InstanceID, dm.RackID, dm.MemberEpoch = m.id, m.instanceID, m.rackID, m.epoch
		dm.ClientID, dm.ClientHost = m.clientID, m.clientHost
		dm.SubscribedTopics = slices.Clone(m.subscribed)
		if dm.SubscribedTopics == nil {
			dm.SubscribedTopics = []string{}
		}
		dm.SubscribedTopicRegex = m.regex
		dm.Assignment = describedAssignment(m.assigned)
		dm.TargetAssignment = describedAssignment(g.target[m.id])
		dm.MemberType = 1 // consumer protocol (0 would be a classic member)
		dg.Members = append(dg.Members, dm)
	}
}

func describedAssignment(a assignment) kmsg.Assignment {
	out := kmsg.NewAssignment()
	for _, t := range slices.Sorted(mapKeys(a)) {
		tp := kmsg.NewAssignmentTopicPartition()
		tp.TopicID, tp.Topic, tp.Partitions = topicID(t), t, slices.Clone(a[t])
		out.TopicPartitions = append(out.TopicPartitions, tp)
	}
	return out
}
