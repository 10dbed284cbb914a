package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Coordinator key types.
const (
	coordinatorGroup       = 0
	coordinatorTransaction = 1
)

// handleFindCoordinator names this node the coordinator of every group and
// every transactional id.
func (s *Server) handleFindCoordinator(c *conn, req *kmsg.FindCoordinatorRequest, resp *kmsg.FindCoordinatorResponse) {
	host, port := s.advertised(c.nc.LocalAddr())
	code := int16(0)
	var msg *string
	switch req.CoordinatorType {
	case coordinatorGroup, coordinatorTransaction:
	default:
		code = kerr.InvalidRequest.Code
	}
	if req.Version < 4 {
		resp.ErrorCode, resp.ErrorMessage = code, msg
		if code == 0 {
			resp.NodeID, resp.Host, resp.Port = nodeID, host, port
		} else {
			resp.NodeID, resp.Port = -1, -1
		}
		return
	}
	for _, key := range req.CoordinatorKeys {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		c.Key = key
		c.ErrorCode, c.ErrorMessage = code, msg
		if code == 0 {
			c.NodeID, c.Host, c.Port = nodeID, host, port
		} else {
			c.NodeID, c.Port = -1, -1
		}
		resp.Coordinators = append(resp.Coordinators, c)
	}
}
