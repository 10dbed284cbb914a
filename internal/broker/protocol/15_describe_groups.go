package protocol

import (
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// authorizedOperationsOmitted is what Kafka reports when authorized
// operations were not asked for.
const authorizedOperationsOmitted = -2147483648

// handleDescribe reports live classic groups with their members; a group
// known only by its committed offsets is Empty, an unknown one Dead; a
// live KIP-848 group gets GROUP_ID_NOT_FOUND, as in Kafka.
func (c *coordinator) handleDescribe(req *kmsg.DescribeGroupsRequest, resp *kmsg.DescribeGroupsResponse) {
	var committed []string
	for _, id := range req.Groups {
		dg := kmsg.NewDescribeGroupsResponseGroup()
		dg.Group = id
		dg.AuthorizedOperations = authorizedOperationsOmitted
		if g := c.lockGroup(id, false); g != nil {
			g.describe(&dg)
			g.mu.Unlock()
		} else if c.isConsumerGroup(id) {
			// As Kafka answers DescribeGroups for a consumer group:
			// ConsumerGroupDescribe describes it.
			dg.ErrorCode = kerr.GroupIDNotFound.Code
		} else {
			if committed == nil {
				committed = c.s.b.Groups()
			}
			dg.State = groupDead.String()
			if _, found := slices.BinarySearch(committed, id); found {
				dg.State, dg.ProtocolType = groupEmpty.String(), c.savedProtocolType(id)
			}
		}
		resp.Groups = append(resp.Groups, dg)
	}
}

func (g *group) describe(dg *kmsg.DescribeGroupsResponseGroup) {
	dg.State = g.state.String()
	dg.ProtocolType = g.protocolType
	if g.state == groupStable || g.state == groupCompletingRebalance {
		dg.Protocol = g.protocol
	}
	for _, m := range g.ordered() {
		dm := kmsg.NewDescribeGroupsResponseGroupMember()
		dm.MemberID, dm.InstanceID, dm.ClientID, dm.ClientHost = m.id, m.instanceID, m.clientID, m.clientHost
		if g.state == groupStable {
			dm.ProtocolMetadata = m.metadataFor(g.protocol)
			dm.MemberAssignment = m.assignment
		}
		dg.Members = append(dg.Members, dm)
	}
}
