package protocol

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// Share groups (KIP-932, "queues for Kafka"): members of a share group
// receive records individually, each under an acquisition lock, and accept,
// release or reject each one. This file holds the groups, their members
// and their configs; share_partition.go the per-partition record states;
// share_fetch.go the share sessions, ShareFetch and ShareAcknowledge.
//
// Assignment is server-side and, as Kafka's simple assignor does for a
// single broker, gives every member every partition of the topics it
// subscribes to: the partitions are shared and the record locks, not the
// assignment, keep two members from getting the same record at once.

// Share group configs, with Kafka's names and defaults.
const (
	cfgShareAutoOffsetReset = "share.auto.offset.reset"
	cfgShareLockDuration    = "share.record.lock.duration.ms"
	cfgShareDeliveryLimit   = "share.delivery.count.limit"
	cfgSharePartitionLocks  = "share.partition.max.record.locks"

	defaultShareLockDuration   = 30 * time.Second
	defaultShareDeliveryLimit  = 5
	defaultSharePartitionLocks = 2000
	shareAssignor              = "simple"
)

// shareConfig is a share group's settings.
type shareConfig struct {
	Earliest      bool  `json:"earliest,omitempty"`
	LockMillis    int64 `json:"lock_ms,omitempty"`
	DeliveryLimit int   `json:"delivery_limit,omitempty"`
	MaxLocks      int   `json:"max_locks,omitempty"`
	// DLQ is the dead-letter topic (share_dlq.go), none when empty.
	DLQ string `json:"dlq,omitempty"`
}

func (c shareConfig) lock() time.Duration {
	if c.LockMillis > 0 {
		return time.Duration(c.LockMillis) * time.Millisecond
	}
	return defaultShareLockDuration
}

func (c shareConfig) limit() int {
	if c.DeliveryLimit > 0 {
		return c.DeliveryLimit
	}
	return defaultShareDeliveryLimit
}

func (c shareConfig) maxLocks() int {
	if c.MaxLocks > 0 {
		return c.MaxLocks
	}
	return defaultSharePartitionLocks
}

// entries lists the configs as DescribeConfigs reports them: name, value,
// and whether it is the default.
func (c shareConfig) entries() []configEntry {
	reset := "latest"
	if c.Earliest {
		reset = "earliest"
	}
	return []configEntry{
		{cfgShareAutoOffsetReset, reset, !c.Earliest},
		{cfgShareDeliveryLimit, strconv.Itoa(c.limit()), c.DeliveryLimit == 0},
		{cfgSharePartitionLocks, strconv.Itoa(c.maxLocks()), c.MaxLocks == 0},
		{cfgShareLockDuration, strconv.FormatInt(c.lock().Milliseconds(), 10), c.LockMillis == 0},
		{cfgShareDLQTopic, c.DLQ, c.DLQ == ""},
	}
}

// configEntry is one described group config.
type configEntry struct {
	name, value string
	isDefault   bool
}

// set changes one config (del: back to its default); a bad name or value
// is an error for the caller's response.
func (c *shareConfig) set(name, value string, del bool) error {
	intIn := func(lo, hi int64) (int64, error) {
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%s must be an integer in [%d, %d], not %q", name, lo, hi, value)
		}
		return n, nil
	}
	switch name {
	case cfgShareAutoOffsetReset:
		switch {
		case del || value == "latest":
			c.Earliest = false
		case value == "earliest":
			c.Earliest = true
		default:
			return fmt.Errorf("%s must be earliest or latest, not %q", name, value)
		}
	case cfgShareLockDuration:
		if del {
			c.LockMillis = 0
			return nil
		}
		n, err := intIn(1000, 3600000)
		if err != nil {
			return err
		}
		c.LockMillis = n
	case cfgShareDeliveryLimit:
		if del {
			c.DeliveryLimit = 0
			return nil
		}
		n, err := intIn(2, 10)
		if err != nil {
			return err
		}
		c.DeliveryLimit = int(n)
	case cfgSharePartitionLocks:
		if del {
			c.MaxLocks = 0
			return nil
		}
		n, err := intIn(100, 10000)
		if err != nil {
			return err
		}
		c.MaxLocks = int(n)
	case cfgShareDLQTopic:
		if del || value == "" {
			c.DLQ = ""
			return nil
		}
		if err := broker.ValidateTopicName(value); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		c.DLQ = value
	default:
		return fmt.Errorf("%w %q", ErrUnknownShareGroupConfig, name)
	}
	return nil
}

// shareCoordinator holds the share groups of a Server.
type shareCoordinator struct {
	s      *Server
	mu     sync.Mutex
	groups map[string]*shareGroup
	closed bool
}

// shareGroup is one share group: members, configs, and the state of each
// share partition. mu guards all of it.
type shareGroup struct {
	id    string
	mu    sync.Mutex
	epoch int32
	cfg   shareConfig
	// members by member id.
	members map[string]*smember
	parts   map[topicPart]*sharePartition
	// sessions are the share sessions, by member id.
	sessions map[string]*shareSession
	// wake is closed (and replaced) when records become available
	// again, to wake long-polling share fetches.
	wake chan struct{}
}

// smember is a share group member.
type smember struct {
	id, clientID, clientHost string
	rackID                   *string
	epoch                    int32
	subscribed               []string
	// sent is the assignment last sent, to tell when it changed.
	sent  map[string][]int32
	timer *time.Timer
}

func newShareCoordinator(s *Server) *shareCoordinator {
	sc := &shareCoordinator{s: s, groups: map[string]*shareGroup{}}
	sc.restore()
	return sc
}

// group returns the share group id, created when create is set; nil if
// there is none.
func (sc *shareCoordinator) group(id string, create bool) *shareGroup {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed {
		return nil
	}
	g := sc.groups[id]
	if g == nil && create {
		g = newShareGroup(id)
		sc.groups[id] = g
	}
	return g
}

func newShareGroup(id string) *shareGroup {
	return &shareGroup{id: id, members: map[string]*smember{}, parts: map[topicPart]*sharePartition{},
		sessions: map[string]*shareSession{}, wake: make(chan struct{})}
}

// close stops the members' session timers.
func (sc *shareCoordinator) close() {
	sc.mu.Lock()
	sc.closed = true
	groups := make([]*shareGroup, 0, len(sc.groups))
	for _, g := range sc.groups {
		groups = append(groups, g)
	}
	sc.mu.Unlock()
	for _, g := range groups {
		g.mu.Lock()
		for _, m := range g.members {
			m.timer.Stop()
		}
		g.mu.Unlock()
	}
}

// signal wakes the share fetches waiting for available records. g.mu held.
func (g *shareGroup) signal() {
	close(g.wake)
	g.wake = make(chan struct{})
}

// assignment is what a member gets: every partition of each subscribed
// topic that exists.
func (sc *shareCoordinator) assignment(m *smember) map[string][]int32 {
	out := map[string][]int32{}
	for _, name := range m.subscribed {
		ti, err := sc.s.b.Topic(name)
		if err != nil {
			continue
		}
		parts := make([]int32, 0, len(ti.Partitions))
		for i := range ti.Partitions {
			parts = append(parts, int32(i))
		}
		out[name] = parts
	}
	return out
}

func sameShareAssignment(a, b map[string][]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !slices.Equal(v, w) {
			return false
		}
	}
	return true
}

// handleShareGroupHeartbeat joins (epoch 0), heartbeats and leaves (epoch
// -1) a share group.
func (sc *shareCoordinator) handleShareGroupHeartbeat(cc *conn, clientID string, req *kmsg.ShareGroupHeartbeatRequest, resp *kmsg.ShareGroupHeartbeatResponse) {
	fail := func(code int16, format string, args ...any) {
		resp.ErrorCode = code
		if format != "" {
			msg := fmt.Sprintf(format, args...)
			resp.ErrorMessage = &msg
		}
	}
	switch {
	case req.GroupID == "":
		fail(kerr.InvalidRequest.Code, "GroupId can't be empty.")
		return
	case req.MemberID == "":
		fail(kerr.InvalidRequest.Code, "MemberId can't be empty.")
		return
	case req.MemberEpoch < -1:
		fail(kerr.InvalidRequest.Code, "MemberEpoch is invalid.")
		return
	case req.MemberEpoch == 0 && req.SubscribedTopicNames == nil:
		fail(kerr.InvalidRequest.Code, "SubscribedTopicNames must be set in first request.")
		return
	}
	if sc.s.groups.isOtherType(req.GroupID) {
		fail(kerr.InconsistentGroupProtocol.Code, "Group %s is not a share group.", req.GroupID)
		return
	}
	g := sc.group(req.GroupID, req.MemberEpoch == 0)
	if g == nil {
		fail(kerr.UnknownMemberID.Code, "")
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.members[req.MemberID]
	if req.MemberEpoch == -1 {
		resp.MemberID, resp.MemberEpoch = &req.MemberID, -1
		if m != nil {
			sc.removeMember(g, m)
		}
		return
	}
	switch {
	case m == nil && req.MemberEpoch != 0:
		fail(kerr.UnknownMemberID.Code, "")
		return
	case m == nil:
		m = &smember{id: req.MemberID}
		g.members[m.id] = m
		g.epoch++
		id := m.id
		m.timer = time.AfterFunc(sc.s.cfg.ConsumerSessionTimeout, func() { sc.expire(g, id) })
	case req.MemberEpoch > m.epoch:
		fail(kerr.FencedMemberEpoch.Code, "member epoch %d is newer than the group's %d", req.MemberEpoch, m.epoch)
		return
	}
	m.timer.Reset(sc.s.cfg.ConsumerSessionTimeout)
	m.clientID, m.clientHost = clientID, cc.clientHost
	if req.RackID != nil {
		id := *req.RackID
		m.rackID = &id
	}
	full := req.MemberEpoch == 0
	if req.SubscribedTopicNames != nil {
		full = true
		names := slices.Compact(slices.Sorted(slices.Values(req.SubscribedTopicNames)))
		if !slices.Equal(names, m.subscribed) {
			m.subscribed = names
			g.epoch++
		}
	}
	target := sc.assignment(m)
	if !sameShareAssignment(target, m.sent) || m.epoch == 0 {
		g.epoch++
		m.epoch = g.epoch
		m.sent = target
		full = true
	}
	resp.MemberID = &m.id
	resp.MemberEpoch = m.epoch
	resp.HeartbeatIntervalMillis = int32(sc.s.cfg.ConsumerHeartbeatInterval.Milliseconds())
	if full {
		a := kmsg.NewShareGroupHeartbeatResponseAssignment()
		for _, name := range slices.Sorted(maps.Keys(target)) {
			tp := kmsg.NewShareGroupHeartbeatResponseAssignmentTopicPartition()
			tp.TopicID, tp.Partitions = topicID(name), target[name]
			a.TopicPartitions = append(a.TopicPartitions, tp)
		}
		resp.Assignment = &a
	}
}

// expire removes a member whose session timed out.
func (sc *shareCoordinator) expire(g *shareGroup, id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.members[id]; m != nil {
		sc.s.log.Info("share group member session timed out", "group", g.id, "member", id)
		sc.removeMember(g, m)
	}
}

// removeMember takes m out of g: its share session closes and its
// acquired records become available again. g.mu held.
func (sc *shareCoordinator) removeMember(g *shareGroup, m *smember) {
	m.timer.Stop()
	delete(g.members, m.id)
	delete(g.sessions, m.id)
	g.epoch++
	if g.releaseMember(m.id, time.Now()) {
		sc.persist(g)
	}
}

// handleShareGroupDescribe describes share groups.
func (sc *shareCoordinator) handleShareGroupDescribe(req *kmsg.ShareGroupDescribeRequest, resp *kmsg.ShareGroupDescribeResponse) {
	for _, id := range req.GroupIDs {
		rg := kmsg.NewShareGroupDescribeResponseGroup()
		rg.GroupID = id
		g := sc.group(id, false)
		if g == nil {
			rg.ErrorCode = kerr.GroupIDNotFound.Code
			msg := fmt.Sprintf("Group %s not found.", id)
			rg.ErrorMessage = &msg
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		g.mu.Lock()
		rg.GroupState, rg.GroupEpoch, rg.AssignmentEpoch, rg.Assignor = "Empty", g.epoch, g.epoch, shareAssignor
		if len(g.members) > 0 {
			rg.GroupState = "Stable"
		}
		for _, mid := range slices.Sorted(maps.Keys(g.members)) {
			m := g.members[mid]
			rm := kmsg.NewShareGroupDescribeResponseGroupMember()
			rm.MemberID, rm.RackID, rm.MemberEpoch, rm.ClientID, rm.ClientHost = m.id, m.rackID, m.epoch, m.clientID, m.clientHost
			rm.SubscribedTopicNames = slices.Clone(m.subscribed)
			for _, name := range slices.Sorted(maps.Keys(m.sent)) {
				tp := kmsg.NewShareGroupDescribeResponseGroupMemberAssignmentTopicPartition()
				tp.TopicID, tp.Topic, tp.Partitions = topicID(name), name, slices.Clone(m.sent[name])
				rm.Assignment.TopicPartitions = append(rm.Assignment.TopicPartitions, tp)
			}
			rg.Members = append(rg.Members, rm)
		}
		g.mu.Unlock()
		resp.Groups = append(resp.Groups, rg)
	}
}

// describeConfigs answers DescribeConfigs for a group resource.
func (sc *shareCoordinator) describeConfigs(rr kmsg.DescribeConfigsRequestResource, r *kmsg.DescribeConfigsResponseResource) {
	var cfg shareConfig
	if g := sc.group(rr.ResourceName, false); g != nil {
		g.mu.Lock()
		cfg = g.cfg
		g.mu.Unlock()
	}
	for _, e := range cfg.entries() {
		if rr.ConfigNames != nil && !slices.Contains(rr.ConfigNames, e.name) {
			continue
		}
		c := kmsg.NewDescribeConfigsResponseResourceConfig()
		v := e.value
		c.Name, c.Value, c.ConfigType = e.name, &v, kmsg.ConfigTypeString
		c.Source, c.IsDefault = kmsg.ConfigSourceGroupConfig, false
		if e.isDefault {
			c.Source, c.IsDefault = kmsg.ConfigSourceDefaultConfig, true
		}
		r.Configs = append(r.Configs, c)
	}
}

// alterConfigs applies IncrementalAlterConfigs (incremental) or
// AlterConfigs (replacing: configs not named go back to their defaults)
// to a share group, which it creates if there is none yet.
func (sc *shareCoordinator) alterConfigs(group string, names, values []string, dels []bool, incremental, validateOnly bool) (int16, error) {
	if sc.s.groups.isOtherType(group) {
		return kerr.InvalidRequest.Code, fmt.Errorf("group %s is not a share group", group)
	}
	g := sc.group(group, true)
	if g == nil {
		return kerr.CoordinatorNotAvailable.Code, fmt.Errorf("the coordinator is closing")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	next := g.cfg
	if !incremental {
		next = shareConfig{}
	}
	for i, name := range names {
		if err := next.set(name, values[i], dels[i]); err != nil {
			return kerr.InvalidConfig.Code, err
		}
	}
	if validateOnly {
		return 0, nil
	}
	g.cfg = next
	sc.persist(g)
	return 0, nil
}

// isOtherType reports whether id is a classic or consumer group, which a
// share group may not share an id with.
func (c *coordinator) isOtherType(id string) bool {
	c.mu.Lock()
	_, classic := c.groups[id]
	_, consumer := c.cgroups[id]
	c.mu.Unlock()
	return classic || consumer
}

// incrementalGroup applies IncrementalAlterConfigs to a share group: SET
// and DELETE (APPEND and SUBTRACT are for list configs; it has none).
func (s *Server) incrementalGroup(rr kmsg.IncrementalAlterConfigsRequestResource, validateOnly bool) (int16, error) {
	names, values, dels := make([]string, 0, len(rr.Configs)), make([]string, 0, len(rr.Configs)), make([]bool, 0, len(rr.Configs))
	for _, c := range rr.Configs {
		switch c.Op {
		case kmsg.IncrementalAlterConfigOpSet, kmsg.IncrementalAlterConfigOpDelete:
		default:
			return kerr.InvalidRequest.Code, fmt.Errorf("%s is not a list config: only SET and DELETE apply", c.Name)
		}
		names, values, dels = append(names, c.Name), append(values, strOrEmpty(c.Value)), append(dels, c.Op == kmsg.IncrementalAlterConfigOpDelete)
	}
	return s.share.alterConfigs(rr.ResourceName, names, values, dels, true, validateOnly)
}

// errOutcome is a response's error code and message.
func errOutcome(code int16, err error) (int16, *string) {
	if err == nil {
		return code, nil
	}
	msg := err.Error()
	return code, &msg
}

func strOrEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// authorizeShare refuses a share group request whose group c may not read
// (describe, for ShareGroupDescribe, answered per group, and
// DescribeShareGroupOffsets; delete for DeleteShareGroupOffsets); the
// share fetch handlers check each topic.
func (s *Server) authorizeShare(c *conn, r kmsg.Request) kmsg.Response {
	var group string
	op := kmsg.ACLOperationRead
	switch req := r.(type) {
	case *kmsg.AlterShareGroupOffsetsRequest:
		group = req.GroupID
	case *kmsg.DeleteShareGroupOffsetsRequest:
		group, op = req.GroupID, kmsg.ACLOperationDelete
	case *kmsg.DescribeShareGroupOffsetsRequest:
		denied := false
		for _, g := range req.Groups {
			denied = denied || !s.canGroup(c, kmsg.ACLOperationDescribe, g.GroupID)
		}
		if !denied {
			return nil
		}
		resp := req.ResponseKind().(*kmsg.DescribeShareGroupOffsetsResponse)
		for _, g := range req.Groups {
			rg := kmsg.NewDescribeShareGroupOffsetsResponseGroup()
			rg.GroupID, rg.ErrorCode = g.GroupID, groupDenied
			resp.Groups = append(resp.Groups, rg)
		}
		return resp
	case *kmsg.ShareGroupHeartbeatRequest:
		group = req.GroupID
	case *kmsg.ShareFetchRequest:
		group = strOrEmpty(req.GroupID)
	case *kmsg.ShareAcknowledgeRequest:
		group = strOrEmpty(req.GroupID)
	case *kmsg.ShareGroupDescribeRequest:
		resp := req.ResponseKind().(*kmsg.ShareGroupDescribeResponse)
		var allowed []string
		for _, id := range req.GroupIDs {
			if s.canGroup(c, kmsg.ACLOperationDescribe, id) {
				allowed = append(allowed, id)
				continue
			}
			rg := kmsg.NewShareGroupDescribeResponseGroup()
			rg.GroupID, rg.ErrorCode = id, groupDenied
			resp.Groups = append(resp.Groups, rg)
		}
		if len(allowed) == len(req.GroupIDs) {
			return nil
		}
		sub := *req
		sub.GroupIDs = allowed
		s.share.handleShareGroupDescribe(&sub, resp)
		return resp
	}
	if s.canGroup(c, op, group) {
		return nil
	}
	resp := r.ResponseKind()
	switch resp := resp.(type) {
	case *kmsg.ShareGroupHeartbeatResponse:
		resp.ErrorCode = groupDenied
	case *kmsg.ShareFetchResponse:
		resp.ErrorCode = groupDenied
	case *kmsg.ShareAcknowledgeResponse:
		resp.ErrorCode = groupDenied
	case *kmsg.AlterShareGroupOffsetsResponse:
		resp.ErrorCode = groupDenied
	case *kmsg.DeleteShareGroupOffsetsResponse:
		resp.ErrorCode = groupDenied
	}
	return resp
}
