package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleDescribeCluster names the cluster and its one broker, as Metadata
// does, and when asked for, the operations the client may do on the
// cluster (clusterOperations).
func (s *Server) handleDescribeCluster(c *conn, req *kmsg.DescribeClusterRequest, resp *kmsg.DescribeClusterResponse) {
	if req.EndpointType > 1 {
		msg := "only broker endpoints are described"
		resp.ErrorCode, resp.ErrorMessage = kerr.UnsupportedEndpointType.Code, &msg
		return
	}
	host, port := s.advertised(c.nc.LocalAddr())
	resp.ClusterID, resp.ControllerID, resp.EndpointType = s.cfg.ClusterID, nodeID, 1
	b := kmsg.NewDescribeClusterResponseBroker()
	b.NodeID, b.Host, b.Port = nodeID, host, port
	resp.Brokers = append(resp.Brokers, b)
	resp.ClusterAuthorizedOperations = authorizedOperationsOmitted
	if req.IncludeClusterAuthorizedOperations {
		resp.ClusterAuthorizedOperations = s.clusterOperations(c)
	}
}
