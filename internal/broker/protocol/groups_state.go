package protocol

import (
	"encoding/json"
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
	ProtocolType string        `json:"protocol_type"`
	Protocol     string        `json:"protocol,omitempty"`
	Leader       string        `json:"leader,omitempty"`
	Generation   int32         `json:"generation"`
	Members      []savedMember `json:"members,omitempty"`
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
