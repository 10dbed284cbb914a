package protocol

import (
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleLeave removes members (v3+: several, by member or instance id;
// v5+ each with a reason) and rebalances the rest at once.
func (c *coordinator) handleLeave(req *kmsg.LeaveGroupRequest, resp *kmsg.LeaveGroupResponse) {
	leaving := req.Members
	if req.Version < 3 {
		lm := kmsg.NewLeaveGroupRequestMember()
		lm.MemberID = req.MemberID
		leaving = []kmsg.LeaveGroupRequestMember{lm}
	}
	g := c.lockGroup(req.Group, false)
	codes := make([]int16, len(leaving))
	if g == nil {
		for i := range codes {
			codes[i] = kerr.UnknownMemberID.Code
		}
	} else {
		for i, lm := range leaving {
			codes[i] = g.leave(lm.MemberID, lm.InstanceID, lm.Reason)
		}
		c.retire(g)
		g.mu.Unlock()
	}
	if req.Version < 3 {
		resp.ErrorCode = codes[0]
		return
	}
	for i, lm := range leaving {
		rm := kmsg.NewLeaveGroupResponseMember()
		rm.MemberID, rm.InstanceID, rm.ErrorCode = lm.MemberID, lm.InstanceID, codes[i]
		resp.Members = append(resp.Members, rm)
	}
}

// leave removes a member; its reason (v5+) is logged, as Kafka logs it.
func (g *group) leave(memberID string, instanceID, reason *string) int16 {
	if instanceID != nil {
		owner, ok := g.static[*instanceID]
		if !ok {
			return kerr.UnknownMemberID.Code
		}
		if memberID != "" && memberID != owner {
			return kerr.FencedInstanceID.Code
		}
		memberID = owner
	}
	m, ok := g.members[memberID]
	if !ok {
		if t, pending := g.pending[memberID]; pending {
			t.Stop()
			delete(g.pending, memberID)
			g.maybeCompleteJoin()
			return 0
		}
		return kerr.UnknownMemberID.Code
	}
	why := ""
	if reason != nil {
		why = *reason
	}
	g.c.s.log.Debug("group member left", "group", g.id, "member", memberID, "reason", why)
	g.removeMember(m, kerr.UnknownMemberID.Code)
	return 0
}
