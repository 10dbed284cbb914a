package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleHeartbeat keeps a member's session alive and tells it when the
// group is rebalancing, so that it rejoins.
func (c *coordinator) handleHeartbeat(req *kmsg.HeartbeatRequest, resp *kmsg.HeartbeatResponse) {
	g := c.lockGroup(req.Group, false)
	if g == nil {
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return
	}
	defer g.mu.Unlock()
	m, code := g.validMember(req.MemberID, req.InstanceID, req.Generation)
	if code != 0 {
		resp.ErrorCode = code
		return
	}
	g.touch(m)
	if g.state == groupPreparingRebalance {
		resp.ErrorCode = kerr.RebalanceInProgress.Code
	}
}
