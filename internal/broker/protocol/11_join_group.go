package protocol

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleJoin admits a member to the group's next generation and answers
// once that generation is formed (or at once, when the member rejoins a
// generation that need not change). New dynamic members on v4+ first get
// MEMBER_ID_REQUIRED with their id, as Kafka does (KIP-394). A static
// member (group.instance.id) rejoining under a new member id takes over its
// old identity and assignment without a rebalance unless its protocols
// changed; a leader rejoining a Stable group that way gets the member list
// with SkipAssignment (v9+, KIP-814), as Kafka answers it.
func (c *coordinator) handleJoin(ctx context.Context, cc *conn, clientID string, req *kmsg.JoinGroupRequest, resp *kmsg.JoinGroupResponse) {
	resp.Generation = -1
	cfg := c.s.cfg
	session := time.Duration(req.SessionTimeoutMillis) * time.Millisecond
	rebalance := time.Duration(req.RebalanceTimeoutMillis) * time.Millisecond
	if req.Version < 1 || rebalance <= 0 {
		rebalance = session
	}
	switch {
	case req.Group == "":
		resp.ErrorCode = kerr.InvalidGroupID.Code
		return
	case session < cfg.MinSessionTimeout || session > cfg.MaxSessionTimeout:
		resp.ErrorCode = kerr.InvalidSessionTimeout.Code
		return
	case req.ProtocolType == "" || len(req.Protocols) == 0:
		resp.ErrorCode = kerr.InconsistentGroupProtocol.Code
		return
	}
	var instanceID *string
	if req.Version >= 5 && req.InstanceID != nil {
		id := *req.InstanceID
		instanceID = &id
	}

	if c.isConsumerGroup(req.Group) {
		resp.ErrorCode = kerr.InconsistentGroupProtocol.Code
		return
	}
	g := c.lockGroup(req.Group, true)
	if g == nil {
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		return
	}
	wait, res := g.join(req, clientID, cc.clientHost, instanceID, session, rebalance)
	if wait == nil && res.code != 0 {
		c.retire(g)
	}
	g.mu.Unlock()
	if wait != nil {
		select {
		case res = <-wait:
		case <-ctx.Done():
			resp.ErrorCode = kerr.RebalanceInProgress.Code
			return
		}
	}
	resp.ErrorCode = res.code
	resp.Generation = res.generation
	resp.MemberID = res.memberID
	resp.LeaderID = res.leader
	resp.Members = res.members
	resp.SkipAssignment = res.skipAssignment
	if res.code == 0 {
		pt, proto := req.ProtocolType, res.protocol
		resp.ProtocolType, resp.Protocol = &pt, &proto
	}
}

// join applies a JoinGroup to the locked group. It returns either a
// channel the answer will come on, or the answer itself.
func (g *group) join(req *kmsg.JoinGroupRequest, clientID, clientHost string, instanceID *string, session, rebalance time.Duration) (chan joinResult, joinResult) {
	failed := func(code int16, memberID string) (chan joinResult, joinResult) {
		return nil, joinResult{code: code, generation: -1, memberID: memberID}
	}
	if !g.supports(req.ProtocolType, req.Protocols) {
		return failed(kerr.InconsistentGroupProtocol.Code, req.MemberID)
	}
	update := func(m *member) {
		m.protocolType, m.protocols = req.ProtocolType, req.Protocols
		m.sessionTimeout, m.rebalanceTimeout = session, rebalance
		m.clientID, m.clientHost = clientID, clientHost
	}
	newMember := func(id string) (chan joinResult, joinResult) {
		m := &member{id: id, instanceID: instanceID}
		update(m)
		g.addMember(m)
		wait := m.join
		g.prepareRebalance()
		g.maybeCompleteJoin()
		return wait, joinResult{}
	}

	if req.MemberID == "" {
		id := newMemberID(clientID)
		if instanceID != nil {
			if old, ok := g.static[*instanceID]; ok {
				return g.replaceStatic(g.members[old], id, req, update)
			}
			return newMember(id)
		}
		if req.Version >= 4 {
			g.pending[id] = time.AfterFunc(session, func() { g.expirePending(id) })
			return failed(kerr.MemberIDRequired.Code, id)
		}
		return newMember(id)
	}

	m, ok := g.members[req.MemberID]
	if !ok {
		if t, pending := g.pending[req.MemberID]; pending && instanceID == nil {
			t.Stop()
			delete(g.pending, req.MemberID)
			return newMember(req.MemberID)
		}
		if instanceID != nil {
			if _, known := g.static[*instanceID]; known {
				return failed(kerr.FencedInstanceID.Code, req.MemberID)
			}
		}
		return failed(kerr.UnknownMemberID.Code, req.MemberID)
	}
	if !sameInstance(m.instanceID, instanceID) {
		return failed(kerr.FencedInstanceID.Code, req.MemberID)
	}
	changed := req.ProtocolType != m.protocolType || !sameProtocols(req.Protocols, m.protocols)
	update(m)
	g.touch(m)
	if m.join != nil {
		// A second JoinGroup from the same member (its first connection
		// died, or it gave up waiting): the old request gets no answer
		// worth having, the new one waits in its place.
		m.join <- joinResult{code: kerr.RebalanceInProgress.Code, generation: -1, memberID: m.id}
	}
	switch g.state {
	case groupCompletingRebalance, groupStable:
		if !changed && (g.state == groupCompletingRebalance || m.id != g.leader) {
			r := g.current(m)
			if m.id == g.leader {
				r.members = g.memberList()
			}
			return nil, r
		}
		m.join = make(chan joinResult, 1)
		g.prepareRebalance()
	default:
		m.join = make(chan joinResult, 1)
	}
	wait := m.join
	g.maybeCompleteJoin()
	return wait, joinResult{}
}

// replaceStatic gives a static member's identity to a new member id: the
// old id is fenced, the assignment kept. As in Kafka, a Stable group does
// not rebalance unless the protocol it would select changes; a rejoining
// leader gets the member list but its SyncGroup changes nothing. In any
// other state the group rebalances so that no assignment names the old id.
func (g *group) replaceStatic(m *member, id string, req *kmsg.JoinGroupRequest, update func(*member)) (chan joinResult, joinResult) {
	m.reply(kerr.FencedInstanceID.Code)
	delete(g.members, m.id)
	if g.leader == m.id {
		g.leader = id
	}
	m.id = id
	g.members[id] = m
	g.static[*m.instanceID] = id
	update(m)
	g.touch(m)
	if g.state == groupStable && g.selectProtocol(g.ordered()) == g.protocol {
		r := g.current(m)
		if g.leader == id {
			r.members, r.skipAssignment = g.memberList(), true
		}
		return nil, r
	}
	m.join = make(chan joinResult, 1)
	g.prepareRebalance()
	wait := m.join
	g.maybeCompleteJoin()
	return wait, joinResult{}
}

func (g *group) memberList() []kmsg.JoinGroupResponseMember {
	ordered := g.ordered()
	members := make([]kmsg.JoinGroupResponseMember, 0, len(ordered))
	for _, m := range ordered {
		jm := kmsg.NewJoinGroupResponseMember()
		jm.MemberID, jm.InstanceID, jm.ProtocolMetadata = m.id, m.instanceID, m.metadataFor(g.protocol)
		members = append(members, jm)
	}
	return members
}

func (g *group) expirePending(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.pending[id]; !ok || g.state == groupDead {
		return
	}
	delete(g.pending, id)
	g.maybeCompleteJoin()
	g.c.retire(g)
}

func sameInstance(a, b *string) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}
