package protocol

import (
	"crypto/rand"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/internal/topicname"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleConsumerGroupHeartbeat joins (epoch 0), heartbeats, reconciles and
// leaves (epoch -1, or -2 for a static member) a KIP-848 consumer group
// (see consumer_group.go).
func (c *coordinator) handleConsumerGroupHeartbeat(cc *conn, clientID string, req *kmsg.ConsumerGroupHeartbeatRequest, resp *kmsg.ConsumerGroupHeartbeatResponse) {
	fail := func(code int16, format string, args ...any) {
		resp.ErrorCode = code
		if format != "" {
			msg := fmt.Sprintf(format, args...)
			resp.ErrorMessage = &msg
		}
	}
	if msg := invalidHeartbeat(req); msg != "" {
		fail(kerr.InvalidRequest.Code, "%s", msg)
		return
	}
	if req.ServerAssignor != nil && *req.ServerAssignor != assignorUniform && *req.ServerAssignor != assignorRange {
		fail(kerr.UnsupportedAssignor.Code, "server assignor %q is not one of %s, %s", *req.ServerAssignor, assignorUniform, assignorRange)
		return
	}
	var re *regexp.Regexp
	if req.SubscribedTopicRegex != nil && *req.SubscribedTopicRegex != "" {
		var err error
		if re, err = regexp.Compile("^(?:" + *req.SubscribedTopicRegex + ")$"); err != nil {
			fail(kerr.InvalidRegularExpression.Code, "subscribed topic regex: %v", err)
			return
		}
	}
	if req.MemberEpoch == 0 && c.classicGroupHasMembers(req.Group) {
		fail(kerr.GroupIDNotFound.Code, "Group %s is not a consumer group.", req.Group)
		return
	}

	g, code := c.lockConsumerGroup(req.Group, req.MemberEpoch == 0)
	if g == nil {
		if code != kerr.GroupIDNotFound.Code {
			fail(code, "")
			return
		}
		if req.MemberEpoch == 0 || c.classicGroupHasMembers(req.Group) {
			fail(code, "Group %s is not a consumer group.", req.Group)
			return
		}
		// An empty group: the member is not (or no longer) in it.
		fail(kerr.UnknownMemberID.Code, "")
		return
	}
	defer g.mu.Unlock()
	defer g.retire()

	if req.MemberEpoch < 0 {
		g.leave(req, resp)
		return
	}

	memberID := req.MemberID
	if memberID == "" { // v0: the coordinator names new members
		memberID = rand.Text()
	}
	m := g.members[memberID]
	changed := false
	switch {
	case m == nil && req.MemberEpoch != 0:
		fail(kerr.UnknownMemberID.Code, "")
		return
	case m == nil:
		if req.InstanceID != nil {
			if old, ok := g.static[*req.InstanceID]; ok {
				prev := g.members[old]
				if !prev.left {
					fail(kerr.UnreleasedInstanceID.Code, "instance %s is held by another member", *req.InstanceID)
					return
				}
				// The static member comes back under a new member id and
				// takes over its assignment.
				g.target[memberID] = g.target[old]
				delete(g.members, old)
				delete(g.target, old)
				prev.stopTimers()
				m = prev
				m.id, m.left, m.timer, m.revokeTimer = memberID, false, nil, nil
				for tp, owner := range g.owners {
					if owner == old {
						g.owners[tp] = memberID
					}
				}
			}
		}
		if m == nil {
			m = &cmember{id: memberID, assigned: assignment{}, revoking: assignment{}, since: map[topicPart]int32{}}
			g.epoch++
		}
		m.sessionLimit = c.s.cfg.ConsumerSessionTimeout
		g.members[memberID] = m
		if req.InstanceID != nil {
			g.static[*req.InstanceID] = memberID
		}
		changed = true
	case req.MemberEpoch == 0:
		// A known member rejoining: it lost its state (or our answer) and
		// owns nothing now; it is given its assignment again.
		changed = g.released(m, assignment{}) || m.left
		m.left = false
	case req.MemberEpoch > m.epoch:
		fail(kerr.FencedMemberEpoch.Code, "member epoch %d is newer than the group's %d", req.MemberEpoch, m.epoch)
		return
	case req.MemberEpoch < m.epoch:
		if req.MemberEpoch != m.prevEpoch || req.Topics == nil || !g.subsetOf(req.Topics, m.assigned) {
			fail(kerr.FencedMemberEpoch.Code, "member epoch %d is older than the group's %d", req.MemberEpoch, m.epoch)
			return
		}
	}

	m.clientID, m.clientHost = clientID, cc.clientHost
	if req.InstanceID != nil {
		id := *req.InstanceID
		m.instanceID = &id
	}
	if req.RackID != nil {
		id := *req.RackID
		m.rackID = &id
	}
	if req.RebalanceTimeoutMillis >= 0 {
		m.rebalanceTimeout = time.Duration(req.RebalanceTimeoutMillis) * time.Millisecond
	}
	if req.ServerAssignor != nil && *req.ServerAssignor != m.assignor {
		m.assignor = *req.ServerAssignor
		g.epoch++
		changed = true
	}
	if req.SubscribedTopicNames != nil {
		names := slices.Sorted(slices.Values(req.SubscribedTopicNames))
		names = slices.Compact(names)
		if !slices.Equal(names, m.subscribed) {
			m.subscribed = names
			g.epoch++
			changed = true
		}
	}
	if req.SubscribedTopicRegex != nil && (m.regex == nil || *m.regex != *req.SubscribedTopicRegex) {
		rx := *req.SubscribedTopicRegex
		m.regex, m.re = &rx, re
		g.epoch++
		changed = true
	}
	g.startSession(m)
	before := m.assigned.clone()

	if req.Topics != nil {
		changed = g.released(m, g.ownedFrom(req.Topics)) || changed
	}
	epoch := g.epoch
	g.refreshTarget()
	changed = g.epoch != epoch || changed
	changed = g.reconcile(m) || changed
	if changed {
		g.save()
	}

	resp.MemberID = &m.id
	resp.MemberEpoch = m.epoch
	resp.HeartbeatIntervalMillis = int32(c.s.cfg.ConsumerHeartbeatInterval.Milliseconds())
	full := req.RebalanceTimeoutMillis != -1 && (req.SubscribedTopicNames != nil || req.SubscribedTopicRegex != nil) && req.Topics != nil
	if req.MemberEpoch == 0 || full || !sameAssignment(before, m.assigned) {
		a := kmsg.NewConsumerGroupHeartbeatResponseAssignment()
		for _, t := range slices.Sorted(mapKeys(m.assigned)) {
			at := kmsg.NewConsumerGroupHeartbeatResponseAssignmentTopic()
			at.TopicID, at.Partitions = topicID(t), slices.Clone(m.assigned[t])
			a.Topics = append(a.Topics, at)
		}
		resp.Assignment = &a
	}
}

func mapKeys(a assignment) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k, ps := range a {
			if len(ps) > 0 && !yield(k) {
				return
			}
		}
	}
}

// invalidHeartbeat is why Kafka would refuse the request as invalid, ""
// when it is valid.
func invalidHeartbeat(req *kmsg.ConsumerGroupHeartbeatRequest) string {
	switch {
	case req.Group == "":
		return "GroupId can't be empty."
	case req.Version >= 1 && req.MemberID == "":
		return "MemberId can't be empty."
	case req.MemberEpoch < -2:
		return "MemberEpoch is invalid."
	case req.MemberEpoch == -2 && req.InstanceID == nil:
		return "InstanceId can't be null when MemberEpoch is -2."
	case req.MemberEpoch > 0 && req.MemberID == "":
		return "MemberId can't be empty."
	case req.MemberEpoch == 0 && req.RebalanceTimeoutMillis == -1:
		return "RebalanceTimeoutMs must be provided in first request."
	case req.MemberEpoch == 0 && len(req.Topics) > 0:
		return "TopicPartitions must be empty when (re-)joining."
	case req.MemberEpoch == 0 && req.SubscribedTopicNames == nil && req.SubscribedTopicRegex == nil:
		return "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
	}
	return ""
}

// classicGroupHasMembers reports whether a classic group with members (or
// members on their way in) holds the id.
func (c *coordinator) classicGroupHasMembers(id string) bool {
	g := c.lockGroup(id, false)
	if g == nil {
		return false
	}
	defer g.mu.Unlock()
	return len(g.members) > 0 || len(g.pending) > 0
}

// leave removes the member (epoch -1) or, for a static member with epoch
// -2, keeps its assignment for its instance id until it rejoins or its
// session expires.
func (g *cgroup) leave(req *kmsg.ConsumerGroupHeartbeatRequest, resp *kmsg.ConsumerGroupHeartbeatResponse) {
	m := g.members[req.MemberID]
	if m == nil {
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return
	}
	resp.MemberID, resp.MemberEpoch = &m.id, req.MemberEpoch
	if req.MemberEpoch == -2 && m.instanceID != nil {
		m.left = true
		g.c.s.log.Debug("static consumer group member left temporarily", "group", g.id, "member", m.id)
		g.save()
		return
	}
	g.c.s.log.Debug("consumer group member left", "group", g.id, "member", m.id)
	g.remove(m)
	g.save()
}

// ownedFrom is the assignment a heartbeat lists as owned, by topic name.
func (g *cgroup) ownedFrom(topics []kmsg.ConsumerGroupHeartbeatRequestTopic) assignment {
	names := g.c.topicNames()
	owned := assignment{}
	for _, t := range topics {
		name, ok := names[t.TopicID]
		if !ok {
			continue
		}
		for _, p := range t.Partitions {
			owned.add(name, p)
		}
	}
	return owned
}

func (g *cgroup) subsetOf(topics []kmsg.ConsumerGroupHeartbeatRequestTopic, a assignment) bool {
	ok := true
	g.ownedFrom(topics).each(func(t string, p int32) {
		if !a.has(t, p) {
			ok = false
		}
	})
	return ok
}

// topicNames maps topic ids to names.
func (c *coordinator) topicNames() map[[16]byte]string {
	names := map[[16]byte]string{}
	for _, ti := range c.s.b.Topics() {
		names[topicID(ti.Name)] = ti.Name
	}
	names[topicID(topicname.ConsumerOffsets)] = topicname.ConsumerOffsets
	return names
}
