package protocol

import (
	"context"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleSync hands out the leader's assignment. Followers that sync first
// wait for the leader; the leader's SyncGroup makes the group Stable and
// answers everyone.
func (c *coordinator) handleSync(ctx context.Context, req *kmsg.SyncGroupRequest, resp *kmsg.SyncGroupResponse) {
	wait, res := c.sync(req)
	if wait != nil {
		select {
		case res = <-wait:
		case <-ctx.Done():
			res = syncResult{code: kerr.RebalanceInProgress.Code}
		}
	}
	resp.ErrorCode = res.code
	resp.MemberAssignment = res.assignment
	if res.code == 0 && req.Version >= 5 {
		resp.ProtocolType, resp.Protocol = req.ProtocolType, req.Protocol
	}
}

func (c *coordinator) sync(req *kmsg.SyncGroupRequest) (chan syncResult, syncResult) {
	g := c.lockGroup(req.Group, false)
	if g == nil {
		return nil, syncResult{code: kerr.UnknownMemberID.Code}
	}
	defer g.mu.Unlock()
	m, code := g.validMember(req.MemberID, req.InstanceID, req.Generation)
	if code != 0 {
		return nil, syncResult{code: code}
	}
	if (req.ProtocolType != nil && *req.ProtocolType != g.protocolType) || (req.Protocol != nil && *req.Protocol != g.protocol) {
		return nil, syncResult{code: kerr.InconsistentGroupProtocol.Code}
	}
	switch g.state {
	case groupPreparingRebalance:
		return nil, syncResult{code: kerr.RebalanceInProgress.Code}
	case groupStable:
		g.touch(m)
		return nil, syncResult{assignment: m.assignment}
	case groupCompletingRebalance:
	default:
		return nil, syncResult{code: kerr.UnknownMemberID.Code}
	}
	g.touch(m)
	if m.sync != nil {
		m.sync <- syncResult{code: kerr.RebalanceInProgress.Code}
	}
	m.sync = make(chan syncResult, 1)
	wait := m.sync
	if m.id == g.leader {
		for _, a := range req.GroupAssignment {
			if am, ok := g.members[a.MemberID]; ok {
				am.assignment = a.MemberAssignment
			}
		}
		for _, am := range g.members {
			if am.assignment == nil {
				am.assignment = []byte{}
			}
		}
		g.stopTimers()
		g.state = groupStable
		g.save()
		for _, am := range g.members {
			if am.sync != nil {
				am.sync <- syncResult{assignment: am.assignment}
				am.sync = nil
			}
		}
		c.s.log.Debug("group stable", "group", g.id, "generation", g.generation, "members", len(g.members))
	}
	return wait, syncResult{}
}

// validMember checks a request's member id, instance id and generation
// against the locked group.
func (g *group) validMember(memberID string, instanceID *string, generation int32) (*member, int16) {
	if instanceID != nil {
		if owner, ok := g.static[*instanceID]; ok && owner != memberID {
			return nil, kerr.FencedInstanceID.Code
		}
	}
	m, ok := g.members[memberID]
	if !ok {
		return nil, kerr.UnknownMemberID.Code
	}
	if instanceID != nil && !sameInstance(m.instanceID, instanceID) {
		return nil, kerr.FencedInstanceID.Code
	}
	if generation != g.generation {
		return nil, kerr.IllegalGeneration.Code
	}
	return m, 0
}
