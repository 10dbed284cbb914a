package protocol

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Durable membership. A group's membership (generation, protocol, leader,
// and each member with its protocols, timeouts and assignment) is saved in
// the broker beside its committed offsets each time the group becomes
// Stable or Empty, and restored when the listener starts: after a relay
// restart or a takeover, members that come back within their session
// timeout find their member id and generation valid, so their heartbeats
// and commits are accepted and nothing rebalances; a member that does not
// come back expires as usual, and only then does the group rebalance.
//
// What is saved is the last Stable (or Empty) state, not every step of a
// rebalance: a restart in the middle of one restores the previous
// generation, and the members' JoinGroup of the new one starts the
// rebalance again. A failed save is logged and does not fail the
// rebalance: the group then restarts from the previous saved state, or
// rebalances, as it did before membership was durable.

// savedGroup is a group's membership as the broker keeps it.
type savedGroup struct {
	// Type is "consumer" for a KIP-848 group (its state in Consumer),
	// empty for a classic one.
	Type         string         `json:"type,omitempty"`
	ProtocolType string         `json:"protocol_type"`
	Protocol     string         `json:"protocol,omitempty"`
	Leader       string         `json:"leader,omitempty"`
	Generation   int32          `json:"generation"`
	Members      []savedMember  `json:"members,omitempty"`
	Consumer     *savedConsumer `json:"consumer,omitempty"`
}

type savedMember struct {
	ID                 string          `json:"id"`
	InstanceID         *string         `json:"instance_id,omitempty"`
	ClientID           string          `json:"client_id"`
	ClientHost         string          `json:"client_host"`
	ProtocolType       string          `json:"protocol_type"`
	Protocols          []savedProtocol `json:"protocols"`
	SessionTimeoutMS   int64           `json:"session_timeout_ms"`
	RebalanceTimeoutMS int64           `json:"rebalance_timeout_ms"`
	Assignment         []byte          `json:"assignment"`
}

type savedProtocol struct {
	Name     string `json:"name"`
	Metadata []byte `json:"metadata"`
}

// save stores the locked group's membership in the broker (unless
// Config.EphemeralGroups).
func (g *group) save() {
	if g.c.s.cfg.EphemeralGroups {
		return
	}
	sg := savedGroup{ProtocolType: g.protocolType, Protocol: g.protocol, Leader: g.leader, Generation: g.generation}
	for _, m := range g.ordered() {
		sm := savedMember{ID: m.id, InstanceID: m.instanceID, ClientID: m.clientID, ClientHost: m.clientHost,
			ProtocolType: m.protocolType, SessionTimeoutMS: m.sessionTimeout.Milliseconds(),
			RebalanceTimeoutMS: m.rebalanceTimeout.Milliseconds(), Assignment: m.assignment}
		for _, p := range m.protocols {
			sm.Protocols = append(sm.Protocols, savedProtocol{Name: p.Name, Metadata: p.Metadata})
		}
		sg.Members = append(sg.Members, sm)
	}
	b, err := json.Marshal(sg)
	if err == nil {
		err = g.c.s.b.SaveGroupMembership(g.id, b)
	}
	if err != nil {
		g.c.s.log.Warn("saving a group's membership failed; a restart will rebalance it", "group", g.id, "err", err)
	}
}

// restore rebuilds the groups saved in the broker: those with members as
// Stable, each member's session starting now.
func (c *coordinator) restore() {
	for id, raw := range c.s.b.GroupMemberships() {
		var sg savedGroup
		if err := json.Unmarshal(raw, &sg); err != nil {
			c.s.log.Warn("a saved group membership is unreadable; the group will rebalance", "group", id, "err", err)
			continue
		}
		if sg.Type == groupTypeConsumer {
			if sg.Consumer != nil && len(sg.Consumer.Members) > 0 {
				c.cgroups[id] = c.restoreConsumerGroup(id, sg.Consumer)
			}
			continue
		}
		if len(sg.Members) == 0 {
			continue
		}
		g := c.newGroup(id)
		g.state, g.protocolType, g.protocol, g.leader, g.generation = groupStable, sg.ProtocolType, sg.Protocol, sg.Leader, sg.Generation
		for _, sm := range sg.Members {
			m := &member{id: sm.ID, instanceID: sm.InstanceID, clientID: sm.ClientID, clientHost: sm.ClientHost,
				protocolType: sm.ProtocolType, sessionTimeout: time.Duration(sm.SessionTimeoutMS) * time.Millisecond,
				rebalanceTimeout: time.Duration(sm.RebalanceTimeoutMS) * time.Millisecond, assignment: sm.Assignment}
			for _, p := range sm.Protocols {
				m.protocols = append(m.protocols, kmsg.JoinGroupRequestProtocol{Name: p.Name, Metadata: p.Metadata})
			}
			g.seq++
			m.seq = g.seq
			g.members[m.id] = m
			if m.instanceID != nil {
				g.static[*m.instanceID] = m.id
			}
			m.timer = time.AfterFunc(m.sessionTimeout, func() { g.expire(m) })
			m.deadline = time.Now().Add(m.sessionTimeout)
		}
		c.groups[id] = g
		c.s.log.Info("restored a consumer group's membership", "group", id, "generation", g.generation, "members", len(g.members))
	}
}

// savedProtocolType is the protocol type saved for a group that has no
// live state (Empty, known by its offsets), "" when none was saved.
func (c *coordinator) savedProtocolType(id string) string {
	raw, ok := c.s.b.GroupMembership(id)
	if !ok {
		return ""
	}
	var sg savedGroup
	if json.Unmarshal(raw, &sg) != nil {
		return ""
	}
	return sg.ProtocolType
}

// groupTypeConsumer is the saved type, and Kafka's group type, of KIP-848
// groups.
const groupTypeConsumer = "consumer"

// savedConsumer is a KIP-848 group's state as the broker keeps it: saved
// after every change of epochs, members, targets or assignments, before
// the heartbeat that caused it is answered, so that no member is told of
// an assignment that a restart would forget.
type savedConsumer struct {
	GroupEpoch      int32                 `json:"group_epoch"`
	AssignmentEpoch int32                 `json:"assignment_epoch"`
	Assignor        string                `json:"assignor,omitempty"`
	Partitions      map[string]int32      `json:"partitions,omitempty"`
	Members         []savedConsumerMember `json:"members,omitempty"`
}

type savedConsumerMember struct {
	ID                 string             `json:"id"`
	InstanceID         *string            `json:"instance_id,omitempty"`
	RackID             *string            `json:"rack_id,omitempty"`
	ClientID           string             `json:"client_id"`
	ClientHost         string             `json:"client_host"`
	Subscribed         []string           `json:"subscribed,omitempty"`
	Regex              *string            `json:"regex,omitempty"`
	Assignor           string             `json:"assignor,omitempty"`
	RebalanceTimeoutMS int64              `json:"rebalance_timeout_ms"`
	SessionTimeoutMS   int64              `json:"session_timeout_ms"`
	Epoch              int32              `json:"epoch"`
	PrevEpoch          int32              `json:"prev_epoch"`
	Left               bool               `json:"left,omitempty"`
	Assigned           map[string][]int32 `json:"assigned,omitempty"`
	Revoking           map[string][]int32 `json:"revoking,omitempty"`
	Target             map[string][]int32 `json:"target,omitempty"`
	// Since lists, per topic, the member epoch at which each held
	// partition was given, in the order of Assigned then Revoking.
	Since map[string][]int32 `json:"since,omitempty"`
}

// save stores the locked consumer group's state in the broker (unless
// Config.EphemeralGroups). A failed
// save is logged: the group goes on from memory, and a restart before the
// next successful save restores the previous state, whose members with a
// newer epoch are then fenced and rejoin (FENCED_MEMBER_EPOCH), so no
// partition is held twice, but what they consumed since their last commit
// is read again.
func (g *cgroup) save() {
	if g.c.s.cfg.EphemeralGroups {
		return
	}
	sc := &savedConsumer{GroupEpoch: g.epoch, AssignmentEpoch: g.assignmentEpoch, Assignor: g.assignor, Partitions: g.partitions}
	for _, id := range slices.Sorted(maps.Keys(g.members)) {
		m := g.members[id]
		sm := savedConsumerMember{ID: m.id, InstanceID: m.instanceID, RackID: m.rackID, ClientID: m.clientID, ClientHost: m.clientHost,
			Subscribed: m.subscribed, Regex: m.regex, Assignor: m.assignor, RebalanceTimeoutMS: m.rebalanceTimeout.Milliseconds(),
			SessionTimeoutMS: m.sessionLimit.Milliseconds(), Epoch: m.epoch, PrevEpoch: m.prevEpoch, Left: m.left,
			Assigned: m.assigned, Revoking: m.revoking, Target: g.target[m.id], Since: map[string][]int32{}}
		for _, a := range []assignment{m.assigned, m.revoking} {
			a.each(func(t string, p int32) { sm.Since[t] = append(sm.Since[t], m.since[topicPart{t, p}]) })
		}
		sc.Members = append(sc.Members, sm)
	}
	b, err := json.Marshal(savedGroup{Type: groupTypeConsumer, ProtocolType: consumerProtocolType, Generation: g.epoch, Consumer: sc})
	if err == nil {
		err = g.c.s.b.SaveGroupMembership(g.id, b)
	}
	if err != nil {
		g.c.s.log.Warn("saving a consumer group's state failed; a restart will fence its members", "group", g.id, "err", err)
	}
}

// restoreConsumerGroup rebuilds a saved KIP-848 group, each member's
// session (and revocation deadline) starting now.
func (c *coordinator) restoreConsumerGroup(id string, sc *savedConsumer) *cgroup {
	g := c.newConsumerGroup(id)
	g.epoch, g.assignmentEpoch, g.assignor, g.partitions = sc.GroupEpoch, sc.AssignmentEpoch, sc.Assignor, sc.Partitions
	if g.partitions == nil {
		g.partitions = map[string]int32{}
	}
	for _, sm := range sc.Members {
		m := &cmember{id: sm.ID, instanceID: sm.InstanceID, rackID: sm.RackID, clientID: sm.ClientID, clientHost: sm.ClientHost,
			subscribed: sm.Subscribed, regex: sm.Regex, assignor: sm.Assignor,
			rebalanceTimeout: time.Duration(sm.RebalanceTimeoutMS) * time.Millisecond,
			sessionLimit:     time.Duration(sm.SessionTimeoutMS) * time.Millisecond,
			epoch:            sm.Epoch, prevEpoch: sm.PrevEpoch, left: sm.Left,
			assigned: assignment(sm.Assigned).clone(), revoking: assignment(sm.Revoking).clone(), since: map[topicPart]int32{}}
		if m.regex != nil {
			if re, err := regexp.Compile("^(?:" + *m.regex + ")$"); err == nil {
				m.re = re
			}
		}
		next := map[string]int{}
		for _, a := range []assignment{m.assigned, m.revoking} {
			a.each(func(t string, p int32) {
				tp := topicPart{t, p}
				g.owners[tp] = m.id
				if i := next[t]; i < len(sm.Since[t]) {
					m.since[tp] = sm.Since[t][i]
				}
				next[t]++
			})
		}
		g.target[m.id] = assignment(sm.Target).clone()
		g.members[m.id] = m
		if m.instanceID != nil {
			g.static[*m.instanceID] = m.id
		}
		g.startSession(m)
		if len(m.revoking) > 0 {
			m.revokeUntil = time.Now().Add(m.rebalanceTimeout)
			m.revokeTimer = time.AfterFunc(m.rebalanceTimeout, func() { g.revokeExpired(m) })
		}
	}
	c.s.log.Info("restored a consumer group's state", "group", id, "epoch", g.epoch, "members", len(g.members))
	return g
}

// savedConsumerGroup is the saved state of a KIP-848 group, if the id's
// saved state is one.
func (c *coordinator) savedConsumerGroup(id string) (savedConsumer, bool) {
	raw, ok := c.s.b.GroupMembership(id)
	if !ok {
		return savedConsumer{}, false
	}
	var sg savedGroup
	if json.Unmarshal(raw, &sg) != nil || sg.Type != groupTypeConsumer || sg.Consumer == nil {
		return savedConsumer{}, false
	}
	return *sg.Consumer, true
}

// savedGroupType is Kafka's group type of a group with no live state:
// "consumer" for a KIP-848 group, "classic" otherwise.
func (c *coordinator) savedGroupType(id string) string {
	if _, ok := c.savedConsumerGroup(id); ok {
		return groupTypeConsumer
	}
	return "classic"
}
