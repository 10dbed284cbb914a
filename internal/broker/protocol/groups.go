package protocol

import (
	"bytes"
	"crypto/rand"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// groupState is a classic consumer group's state, named as Kafka names it.
type groupState int

const (
	groupEmpty groupState = iota
	groupPreparingRebalance
	groupCompletingRebalance
	groupStable
	groupDead
)

func (s groupState) String() string {
	switch s {
	case groupEmpty:
		return "Empty"
	case groupPreparingRebalance:
		return "PreparingRebalance"
	case groupCompletingRebalance:
		return "CompletingRebalance"
	case groupStable:
		return "Stable"
	default:
		return "Dead"
	}
}

// coordinator runs the membership of every classic group. Committed
// offsets are durable in the broker, and so is each group's last Stable or
// Empty membership (groups_state.go).
//
// Lock order: a group's mu may be held while taking coordinator.mu, never
// the other way round.
type coordinator struct {
	s      *Server
	mu     sync.Mutex
	groups map[string]*group
	// cgroups are the KIP-848 consumer groups (consumer_group.go); an id
	// is in at most one of the two maps.
	cgroups map[string]*cgroup
	closed  bool
}

// newCoordinator makes the coordinator, with the groups saved in the
// broker restored (unless Config.EphemeralGroups).
func newCoordinator(s *Server) *coordinator {
	c := &coordinator{s: s, groups: map[string]*group{}, cgroups: map[string]*cgroup{}}
	if !s.cfg.EphemeralGroups {
		c.restore()
	}
	return c
}

// group returns the live group with this id, creating it when create is
// set; nil when there is none (or the coordinator is closed). The caller
// must lock it and retry if it turned out Dead.
func (c *coordinator) group(id string, create bool) *group {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	g := c.groups[id]
	if g == nil && create && c.cgroups[id] == nil {
		g = c.newGroup(id)
		c.groups[id] = g
	}
	return g
}

func (c *coordinator) newGroup(id string) *group {
	return &group{c: c, id: id, members: map[string]*member{}, pending: map[string]*time.Timer{}, static: map[string]string{}}
}

// lockGroup returns the live group locked, or nil.
func (c *coordinator) lockGroup(id string, create bool) *group {
	for {
		g := c.group(id, create)
		if g == nil {
			return nil
		}
		g.mu.Lock()
		if g.state != groupDead {
			return g
		}
		g.mu.Unlock()
	}
}

func (c *coordinator) snapshot() []*group {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Values(c.groups))
}

// close fails every waiting member and stops all timers.
func (c *coordinator) close() {
	c.mu.Lock()
	c.closed = true
	gs := make([]*group, 0, len(c.groups))
	for _, g := range c.groups {
		gs = append(gs, g)
	}
	c.groups = map[string]*group{}
	cgs := slices.Collect(maps.Values(c.cgroups))
	c.cgroups = map[string]*cgroup{}
	c.mu.Unlock()
	for _, g := range cgs {
		g.mu.Lock()
		g.stopAll()
		g.mu.Unlock()
	}
	for _, g := range gs {
		g.mu.Lock()
		for _, m := range g.members {
			m.timer.Stop()
			m.reply(kerr.CoordinatorNotAvailable.Code)
		}
		for _, t := range g.pending {
			t.Stop()
		}
		g.stopTimers()
		g.state = groupDead
		g.mu.Unlock()
	}
}

type group struct {
	c  *coordinator
	id string

	mu           sync.Mutex
	state        groupState
	protocolType string
	protocol     string
	generation   int32
	leader       string
	members      map[string]*member
	// pending holds member ids handed out with MEMBER_ID_REQUIRED that
	// have not joined with them yet, each expiring after its session
	// timeout.
	pending map[string]*time.Timer
	// static maps group.instance.id to the member id holding it.
	static map[string]string
	seq    uint64

	rebalanceTimer *time.Timer
	// initialDelay is set while the first rebalance of an empty group is
	// held for more members; delayLeft is how much longer it may be
	// extended, and joinedDuringDelay whether anyone new came meanwhile.
	initialDelay      bool
	delayLeft         time.Duration
	joinedDuringDelay bool
	syncTimer         *time.Timer
}

type member struct {
	id         string
	instanceID *string
	clientID   string
	clientHost string
	// protocolType and protocols are as last joined, in preference order.
	protocolType     string
	protocols        []kmsg.JoinGroupRequestProtocol
	sessionTimeout   time.Duration
	rebalanceTimeout time.Duration
	seq              uint64
	assignment       []byte

	// join and sync are set while the member waits for a JoinGroup or
	// SyncGroup answer.
	join chan joinResult
	sync chan syncResult

	timer    *time.Timer
	deadline time.Time
}

type joinResult struct {
	code       int16
	generation int32
	protocol   string
	leader     string
	memberID   string
	members    []kmsg.JoinGroupResponseMember
	// skipAssignment tells a static leader that rejoined a Stable group
	// not to assign again (JoinGroup v9+, KIP-814).
	skipAssignment bool
}

type syncResult struct {
	code       int16
	assignment []byte
}

// reply fails whatever the member waits for.
func (m *member) reply(code int16) {
	if m.join != nil {
		m.join <- joinResult{code: code, generation: -1, memberID: m.id}
		m.join = nil
	}
	if m.sync != nil {
		m.sync <- syncResult{code: code}
		m.sync = nil
	}
}

func (m *member) metadataFor(protocol string) []byte {
	for _, p := range m.protocols {
		if p.Name == protocol {
			return p.Metadata
		}
	}
	return nil
}

func (m *member) hasProtocol(name string) bool {
	return slices.ContainsFunc(m.protocols, func(p kmsg.JoinGroupRequestProtocol) bool { return p.Name == name })
}

func sameProtocols(a, b []kmsg.JoinGroupRequestProtocol) bool {
	return slices.EqualFunc(a, b, func(x, y kmsg.JoinGroupRequestProtocol) bool {
		return x.Name == y.Name && bytes.Equal(x.Metadata, y.Metadata)
	})
}

func newMemberID(clientID string) string {
	return clientID + "-" + rand.Text()
}

func (g *group) stopTimers() {
	if g.rebalanceTimer != nil {
		g.rebalanceTimer.Stop()
		g.rebalanceTimer = nil
	}
	if g.syncTimer != nil {
		g.syncTimer.Stop()
		g.syncTimer = nil
	}
}

// supports reports whether a member with these protocols may join: the
// type must match and some protocol must be one every member supports.
func (g *group) supports(protocolType string, protocols []kmsg.JoinGroupRequestProtocol) bool {
	if protocolType == "" || len(protocols) == 0 {
		return false
	}
	if len(g.members) == 0 {
		return true
	}
	if protocolType != g.protocolType {
		return false
	}
	for _, p := range protocols {
		all := true
		for _, m := range g.members {
			if !m.hasProtocol(p.Name) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// addMember adds a new member that waits for the next generation.
func (g *group) addMember(m *member) {
	g.seq++
	m.seq = g.seq
	m.join = make(chan joinResult, 1)
	g.members[m.id] = m
	if m.instanceID != nil {
		g.static[*m.instanceID] = m.id
	}
	if len(g.members) == 1 {
		g.protocolType = m.protocolType
	}
	m.timer = time.AfterFunc(m.sessionTimeout, func() { g.expire(m) })
	m.deadline = time.Now().Add(m.sessionTimeout)
	if g.initialDelay {
		g.joinedDuringDelay = true
	}
}

// touch restarts a member's session timeout.
func (g *group) touch(m *member) {
	m.deadline = time.Now().Add(m.sessionTimeout)
	m.timer.Reset(m.sessionTimeout)
}

// expire removes a member whose session timed out. A member waiting for a
// join or sync answer is kept: the rebalance and sync timeouts bound those
// waits.
func (g *group) expire(m *member) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state == groupDead || g.members[m.id] != m {
		return
	}
	if m.join != nil || m.sync != nil {
		g.touch(m)
		return
	}
	if left := time.Until(m.deadline); left > 0 {
		m.timer.Reset(left)
		return
	}
	g.c.s.log.Info("group member session expired", "group", g.id, "member", m.id, "session_timeout", m.sessionTimeout)
	g.removeMember(m, kerr.UnknownMemberID.Code)
}

// removeMember drops a member and rebalances the rest.
func (g *group) removeMember(m *member, code int16) {
	g.dropMember(m)
	m.reply(code)
	switch g.state {
	case groupStable, groupCompletingRebalance:
		g.prepareRebalance()
		g.maybeCompleteJoin()
	case groupPreparingRebalance:
		g.maybeCompleteJoin()
	}
}

// dropMember forgets a member, and its static instance id if it holds it.
func (g *group) dropMember(m *member) {
	m.timer.Stop()
	delete(g.members, m.id)
	if m.instanceID != nil && g.static[*m.instanceID] == m.id {
		delete(g.static, *m.instanceID)
	}
}

func (g *group) maxRebalanceTimeout() time.Duration {
	var d time.Duration
	for _, m := range g.members {
		d = max(d, m.rebalanceTimeout)
	}
	return d
}

// prepareRebalance starts a new generation: every member must join again
// within the rebalance timeout.
func (g *group) prepareRebalance() {
	if g.state == groupPreparingRebalance {
		return
	}
	if g.state == groupCompletingRebalance {
		for _, m := range g.members {
			if m.sync != nil {
				m.sync <- syncResult{code: kerr.RebalanceInProgress.Code}
				m.sync = nil
			}
		}
	}
	g.stopTimers()
	for _, m := range g.members {
		m.assignment = nil
	}
	wait := g.maxRebalanceTimeout()
	delay := g.c.s.cfg.InitialRebalanceDelay
	if g.state == groupEmpty && delay > 0 {
		g.initialDelay, g.joinedDuringDelay = true, false
		g.delayLeft = max(wait-delay, 0)
		wait = min(delay, wait)
	}
	g.state = groupPreparingRebalance
	gen := g.generation
	g.rebalanceTimer = time.AfterFunc(wait, func() { g.rebalanceTimeout(gen) })
}

func (g *group) rebalanceTimeout(gen int32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != groupPreparingRebalance || g.generation != gen {
		return
	}
	if g.initialDelay {
		delay := g.c.s.cfg.InitialRebalanceDelay
		if g.joinedDuringDelay && g.delayLeft > 0 {
			next := min(delay, g.delayLeft)
			g.delayLeft -= next
			g.joinedDuringDelay = false
			g.rebalanceTimer = time.AfterFunc(next, func() { g.rebalanceTimeout(gen) })
			return
		}
		g.initialDelay = false
	}
	g.completeJoin()
}

// maybeCompleteJoin finishes the rebalance once every member has joined.
func (g *group) maybeCompleteJoin() {
	if g.state != groupPreparingRebalance || g.initialDelay || len(g.pending) > 0 {
		return
	}
	for _, m := range g.members {
		if m.join == nil {
			return
		}
	}
	g.completeJoin()
}

// completeJoin ends the join phase: members that did not rejoin are
// dropped, a protocol is chosen, the generation advances and every member
// learns it (the leader with everyone's metadata, to assign from).
func (g *group) completeJoin() {
	g.stopTimers()
	g.initialDelay = false
	for _, m := range g.members {
		if m.join == nil {
			g.c.s.log.Info("group member did not rejoin in time", "group", g.id, "member", m.id)
			g.dropMember(m)
			m.reply(kerr.UnknownMemberID.Code)
		}
	}
	for id, t := range g.pending {
		t.Stop()
		delete(g.pending, id)
	}
	g.generation++
	if len(g.members) == 0 {
		// The protocol type stays, as Kafka keeps it for an empty group.
		g.state, g.protocol, g.leader = groupEmpty, "", ""
		g.save()
		g.c.retire(g)
		return
	}
	ordered := g.ordered()
	if _, ok := g.members[g.leader]; !ok {
		g.leader = ordered[0].id
	}
	g.protocol = g.selectProtocol(ordered)
	g.state = groupCompletingRebalance
	members := g.memberList()
	for _, m := range ordered {
		r := g.current(m)
		if m.id == g.leader {
			r.members = members
		}
		m.join <- r
		m.join = nil
		g.touch(m)
	}
	g.c.s.log.Debug("group rebalanced", "group", g.id, "generation", g.generation, "members", len(ordered), "leader", g.leader, "protocol", g.protocol)
	gen := g.generation
	g.syncTimer = time.AfterFunc(g.maxRebalanceTimeout(), func() { g.syncTimeout(gen) })
}

// current is the join answer describing the current generation to m.
func (g *group) current(m *member) joinResult {
	return joinResult{generation: g.generation, protocol: g.protocol, leader: g.leader, memberID: m.id}
}

func (g *group) ordered() []*member {
	ms := make([]*member, 0, len(g.members))
	for _, m := range g.members {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b *member) int { return int(a.seq - b.seq) })
	return ms
}

// selectProtocol picks, among the protocols every member supports, the one
// most members prefer most (ties go to the leader's preference order).
func (g *group) selectProtocol(ordered []*member) string {
	leader := g.members[g.leader]
	var candidates []string
	for _, p := range leader.protocols {
		all := true
		for _, m := range ordered {
			if !m.hasProtocol(p.Name) {
				all = false
				break
			}
		}
		if all {
			candidates = append(candidates, p.Name)
		}
	}
	votes := map[string]int{}
	for _, m := range ordered {
		for _, p := range m.protocols {
			if slices.Contains(candidates, p.Name) {
				votes[p.Name]++
				break
			}
		}
	}
	best := ""
	for _, name := range candidates {
		if best == "" || votes[name] > votes[best] {
			best = name
		}
	}
	return best
}

// syncTimeout drops members that never sent SyncGroup for the generation
// (including a leader that never assigned) and rebalances the rest.
func (g *group) syncTimeout(gen int32) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != groupCompletingRebalance || g.generation != gen {
		return
	}
	for _, m := range g.members {
		if m.sync == nil {
			g.c.s.log.Info("group member did not sync in time", "group", g.id, "member", m.id)
			g.dropMember(m)
		}
	}
	g.prepareRebalance()
	g.maybeCompleteJoin()
}

// retire forgets an empty group; its committed offsets stay in the broker.
func (c *coordinator) retire(g *group) {
	if len(g.members) > 0 || len(g.pending) > 0 {
		return
	}
	g.stopTimers()
	g.state = groupDead
	c.mu.Lock()
	if c.groups[g.id] == g {
		delete(c.groups, g.id)
	}
	c.mu.Unlock()
}
