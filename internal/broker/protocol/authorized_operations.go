package protocol

import "github.com/twmb/franz-go/pkg/kmsg"

// Authorized operations (KIP-430): Metadata v8+ (topics, and the cluster
// up to v10), DescribeGroups v3+ and DescribeCluster report, when the
// request asks, the operations the client may do on each resource as a bit
// set (bit n for ACL operation n): every operation Kafka defines for the
// resource type that the Authorizer allows, all of them without one, as
// Kafka computes it. A resource not asked about, or answered with an
// error, keeps authorizedOperationsOmitted.

// topicOperations and groupOperations are the operations Kafka defines on
// a topic and on a group.
var (
	topicOperations = []kmsg.ACLOperation{kmsg.ACLOperationRead, kmsg.ACLOperationWrite, kmsg.ACLOperationCreate,
		kmsg.ACLOperationDelete, kmsg.ACLOperationAlter, kmsg.ACLOperationDescribe,
		kmsg.ACLOperationDescribeConfigs, kmsg.ACLOperationAlterConfigs}
	groupOperations = []kmsg.ACLOperation{kmsg.ACLOperationRead, kmsg.ACLOperationDescribe, kmsg.ACLOperationDelete}
)

// authorizedOperations is the bit set of ops that c may do on the resource.
func (s *Server) authorizedOperations(c *conn, rt kmsg.ACLResourceType, name string, ops []kmsg.ACLOperation) int32 {
	var bits int32
	for _, op := range ops {
		if s.can(c, op, rt, name) {
			bits |= 1 << int(op)
		}
	}
	return bits
}

// metadataOperations fills a Metadata response's authorized operations
// where the request asks for them.
func (s *Server) metadataOperations(c *conn, req *kmsg.MetadataRequest, resp *kmsg.MetadataResponse) {
	resp.AuthorizedOperations = authorizedOperationsOmitted
	if req.Version >= 8 && req.Version <= 10 && req.IncludeClusterAuthorizedOperations {
		resp.AuthorizedOperations = s.clusterOperations(c)
	}
	for i := range resp.Topics {
		t := &resp.Topics[i]
		t.AuthorizedOperations = authorizedOperationsOmitted
		if req.Version >= 8 && req.IncludeTopicAuthorizedOperations && t.ErrorCode == 0 && t.Topic != nil {
			t.AuthorizedOperations = s.authorizedOperations(c, kmsg.ACLResourceTypeTopic, *t.Topic, topicOperations)
		}
	}
}

// handleDescribeGroups is the coordinator's DescribeGroups with each
// group's authorized operations, when asked for (v3+).
func (s *Server) handleDescribeGroups(c *conn, req *kmsg.DescribeGroupsRequest, resp *kmsg.DescribeGroupsResponse) {
	s.groups.handleDescribe(req, resp)
	if req.Version < 3 || !req.IncludeAuthorizedOperations {
		return
	}
	for i := range resp.Groups {
		if g := &resp.Groups[i]; g.ErrorCode == 0 {
			g.AuthorizedOperations = s.authorizedOperations(c, kmsg.ACLResourceTypeGroup, g.Group, groupOperations)
		}
	}
}
