package protocol

import (
	"maps"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/internal/topicname"
)

// KIP-848 consumer groups (the "consumer" group protocol). The coordinator
// keeps them beside the classic groups, and a group id is one or the
// other: a ConsumerGroupHeartbeat for a classic group that has members
// gets GROUP_ID_NOT_FOUND and a JoinGroup for a consumer group that has
// members INCONSISTENT_GROUP_PROTOCOL, as Kafka answers them; an empty
// group of either kind may be taken over by the other protocol.
//
// The server assigns. Each change of membership, of a subscription or of
// a subscribed topic's partition count bumps the group epoch; the next
// heartbeat computes the target assignment for that epoch with the
// group's assignor (uniform or range, assignors.go), and each member is
// reconciled towards its target one heartbeat at a time:
//
//   - a member that holds partitions outside its target is first told to
//     drop them (its assignment shrinks, its epoch stays) and keeps them
//     as "revoking" until a heartbeat lists its owned partitions without
//     them, or it is removed after its rebalance timeout;
//   - a member with nothing to revoke moves to the target epoch and gets
//     the partitions of its target that no other member still holds
//     (assigned or revoking); the others it gets on a later heartbeat,
//     once their previous owner released them.
//
// So no partition is ever held by two members: it is handed out only
// after its previous owner acknowledged revoking it. A member that does
// not heartbeat within the session timeout (Config.ConsumerSessionTimeout,
// broker-side as in Kafka) is removed, and its next heartbeat gets
// UNKNOWN_MEMBER_ID; a heartbeat with an epoch above the member's gets
// FENCED_MEMBER_EPOCH, one below it too unless it is the previous epoch
// and the owned partitions are a subset of the assignment (the response
// bumping the epoch was lost). Member epoch -1 leaves, -2 leaves for a
// static member that keeps its assignment until its session expires or
// it rejoins under the same instance id.
//
// OffsetCommit (v9+, with the member epoch as generation) from a member
// of a consumer group is accepted with its current epoch, or with an
// older one for partitions it held since that epoch (as Kafka does since
// KIP-1251, so a commit racing an epoch bump is not refused); a newer
// epoch gets FENCED_MEMBER_EPOCH, an older one otherwise
// STALE_MEMBER_EPOCH.
//
// The group's state is saved with its offsets each time it changes
// (groups_state.go) before the heartbeat is answered, so a restart finds
// the same members, epochs, assignments and revocations in progress.
//
// How we know: TestConsumerGroupProtocolRaw drives each rule by hand
// (a partition withheld until its owner acknowledged, the epoch errors,
// the commit rules, leave, session expiry, the protocol mix refused);
// TestConsumerGroupSurvivesRestart restarts the broker mid-revocation;
// TestKgoConsumerGroupProtocol runs three franz-go members through joins
// and a leave with both assignors and finds every record read once (it
// reads records twice when the owner check in reconcile is removed);
// franz-go's own KIP-848 tests pass in TestFranzGoSuite.

// consumerProtocolType is the protocol type Kafka reports for KIP-848
// groups, the same as classic consumer groups.
const consumerProtocolType = "consumer"

const (
	assignorUniform = "uniform"
	assignorRange   = "range"
)

// cgroup is one KIP-848 consumer group.
type cgroup struct {
	c  *coordinator
	id string

	mu              sync.Mutex
	dead            bool
	epoch           int32
	assignmentEpoch int32
	assignor        string
	members         map[string]*cmember
	// static maps a group.instance.id to the member id holding it.
	static map[string]string
	// target is each member's target assignment at assignmentEpoch.
	target map[string]assignment
	// owners maps each partition held by a member (assigned or being
	// revoked) to that member.
	owners map[topicPart]string
	// partitions are the partition counts of the subscribed topics that
	// the target was computed from.
	partitions map[string]int32
}

type topicPart struct {
	topic     string
	partition int32
}

// assignment maps topics to sorted partitions.
type assignment map[string][]int32

func (a assignment) has(t string, p int32) bool {
	_, ok := slices.BinarySearch(a[t], p)
	return ok
}

func (a assignment) add(t string, p int32) {
	ps := a[t]
	i, ok := slices.BinarySearch(ps, p)
	if !ok {
		a[t] = slices.Insert(ps, i, p)
	}
}

func (a assignment) each(f func(string, int32)) {
	for _, t := range slices.Sorted(maps.Keys(a)) {
		for _, p := range a[t] {
			f(t, p)
		}
	}
}

func (a assignment) count() int {
	n := 0
	for _, ps := range a {
		n += len(ps)
	}
	return n
}

func (a assignment) clone() assignment {
	out := assignment{}
	for t, ps := range a {
		if len(ps) > 0 {
			out[t] = slices.Clone(ps)
		}
	}
	return out
}

func sameAssignment(a, b assignment) bool {
	if a.count() != b.count() {
		return false
	}
	for t, ps := range a {
		if !slices.Equal(ps, b[t]) {
			return false
		}
	}
	return true
}

// cmember is a member of a consumer group.
type cmember struct {
	id         string
	instanceID *string
	rackID     *string
	clientID   string
	clientHost string
	subscribed []string
	regex      *string
	re         *regexp.Regexp
	assignor   string

	rebalanceTimeout time.Duration
	epoch, prevEpoch int32
	// left is set for a static member that left with epoch -2: it keeps
	// its assignment for the instance until it rejoins or expires.
	left bool
	// assigned is the assignment the member was given, revoking what it
	// was told to drop and has not confirmed dropping yet.
	assigned, revoking assignment
	// since is the member epoch at which it was given each partition it
	// holds.
	since map[topicPart]int32

	timer        *time.Timer
	deadline     time.Time
	revokeTimer  *time.Timer
	revokeUntil  time.Time
	sessionLimit time.Duration
}

func (m *cmember) holds(t string, p int32) bool {
	return m.assigned.has(t, p) || m.revoking.has(t, p)
}

func (c *coordinator) newConsumerGroup(id string) *cgroup {
	return &cgroup{c: c, id: id, members: map[string]*cmember{}, static: map[string]string{},
		target: map[string]assignment{}, owners: map[topicPart]string{}, partitions: map[string]int32{}}
}

// lockConsumerGroup returns the live consumer group locked, creating it
// when create is set. It returns nil and GROUP_ID_NOT_FOUND when there is
// none or a classic group with members holds the id, and nil and
// COORDINATOR_NOT_AVAILABLE once the coordinator closed.
func (c *coordinator) lockConsumerGroup(id string, create bool) (*cgroup, int16) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, kerr.CoordinatorNotAvailable.Code
		}
		g := c.cgroups[id]
		if g == nil {
			if cg := c.groups[id]; cg != nil || !create {
				c.mu.Unlock()
				return nil, kerr.GroupIDNotFound.Code
			}
			g = c.newConsumerGroup(id)
			if sg, ok := c.savedConsumerGroup(id); ok {
				g.epoch, g.assignmentEpoch = sg.GroupEpoch, sg.GroupEpoch
			}
			c.cgroups[id] = g
		}
		c.mu.Unlock()
		g.mu.Lock()
		if !g.dead {
			return g, 0
		}
		g.mu.Unlock()
	}
}

// isConsumerGroup reports whether a live consumer group holds the id.
func (c *coordinator) isConsumerGroup(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cgroups[id] != nil
}

func (c *coordinator) consumerSnapshot() []*cgroup {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Collect(maps.Values(c.cgroups))
}

// state is the group's state as Kafka names it.
func (g *cgroup) state() string {
	switch {
	case len(g.members) == 0:
		return "Empty"
	case g.assignmentEpoch < g.epoch:
		return "Assigning"
	}
	for _, m := range g.members {
		if m.epoch != g.assignmentEpoch || len(m.revoking) > 0 || !sameAssignment(m.assigned, g.target[m.id]) {
			return "Reconciling"
		}
	}
	return "Stable"
}

// retire forgets the locked group once it has no members; its saved state
// (its epoch) and its offsets stay in the broker.
func (g *cgroup) retire() {
	if len(g.members) > 0 {
		return
	}
	g.dead = true
	g.c.mu.Lock()
	if g.c.cgroups[g.id] == g {
		delete(g.c.cgroups, g.id)
	}
	g.c.mu.Unlock()
}

func (g *cgroup) stopAll() {
	for _, m := range g.members {
		m.stopTimers()
	}
	g.dead = true
}

func (m *cmember) stopTimers() {
	m.timer.Stop()
	if m.revokeTimer != nil {
		m.revokeTimer.Stop()
	}
}

// startSession arms the member's session timer.
func (g *cgroup) startSession(m *cmember) {
	m.deadline = time.Now().Add(m.sessionLimit)
	if m.timer == nil {
		m.timer = time.AfterFunc(m.sessionLimit, func() { g.expire(m) })
		return
	}
	m.timer.Reset(m.sessionLimit)
}

func (g *cgroup) expire(m *cmember) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead || g.members[m.id] != m {
		return
	}
	if left := time.Until(m.deadline); left > 0 {
		m.timer.Reset(left)
		return
	}
	g.c.s.log.Info("consumer group member session expired", "group", g.id, "member", m.id, "session_timeout", m.sessionLimit)
	g.remove(m)
	g.save()
	g.retire()
}

// revokeExpired removes a member that did not revoke within its rebalance
// timeout, as Kafka fences it.
func (g *cgroup) revokeExpired(m *cmember) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.dead || g.members[m.id] != m || len(m.revoking) == 0 || time.Now().Before(m.revokeUntil) {
		return
	}
	g.c.s.log.Info("consumer group member did not revoke partitions within its rebalance timeout", "group", g.id, "member", m.id)
	g.remove(m)
	g.save()
	g.retire()
}

// remove drops a member, releasing what it holds, and bumps the epoch.
func (g *cgroup) remove(m *cmember) {
	m.stopTimers()
	delete(g.members, m.id)
	delete(g.target, m.id)
	if m.instanceID != nil && g.static[*m.instanceID] == m.id {
		delete(g.static, *m.instanceID)
	}
	for tp, owner := range g.owners {
		if owner == m.id {
			delete(g.owners, tp)
		}
	}
	g.epoch++
}

// subscription is the sorted set of topics the member subscribes to that
// exist, with their partition counts in counts.
func (g *cgroup) subscription(m *cmember, counts map[string]int32) []string {
	var out []string
	for _, t := range m.subscribed {
		if _, ok := counts[t]; ok {
			out = append(out, t)
		}
	}
	if m.re != nil {
		for t := range counts {
			if m.re.MatchString(t) && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	sort.Strings(out)
	return out
}

// topicCounts is the partition count of every topic.
func (g *cgroup) topicCounts() map[string]int32 {
	counts := map[string]int32{}
	for _, ti := range g.c.s.b.Topics() {
		counts[ti.Name] = int32(len(ti.Partitions))
	}
	counts[topicname.ConsumerOffsets] = offsetsTopicPartitions
	return counts
}

// refreshTarget bumps the epoch when a subscribed topic's partition count
// changed, and computes the target assignment when the epoch is newer than
// the target's.
func (g *cgroup) refreshTarget() {
	counts := g.topicCounts()
	subscribed := map[string]int32{}
	subs := map[string][]string{}
	for id, m := range g.members {
		subs[id] = g.subscription(m, counts)
		for _, t := range subs[id] {
			subscribed[t] = counts[t]
		}
	}
	if !maps.Equal(subscribed, g.partitions) {
		g.epoch++
	}
	if g.assignmentEpoch >= g.epoch {
		return
	}
	g.assignor = g.chooseAssignor()
	prev := g.target
	if g.assignor == assignorRange {
		g.target = assignRange(subs, subscribed)
	} else {
		g.target = assignUniform(subs, subscribed, prev)
	}
	g.partitions = subscribed
	g.assignmentEpoch = g.epoch
}

// chooseAssignor picks the server assignor most members ask for (uniform,
// Kafka's default, when none does; ties go to uniform).
func (g *cgroup) chooseAssignor() string {
	votes := map[string]int{}
	for _, m := range g.members {
		if m.assignor != "" {
			votes[m.assignor]++
		}
	}
	if votes[assignorRange] > votes[assignorUniform] {
		return assignorRange
	}
	return assignorUniform
}

// reconcile moves the member one step towards its target: revoke first;
// with nothing to revoke, take the target epoch and every partition of
// the target no one else holds. It reports whether the member changed.
func (g *cgroup) reconcile(m *cmember) bool {
	if len(m.revoking) > 0 || m.left {
		return false
	}
	target := g.target[m.id]
	keep, revoke := assignment{}, assignment{}
	m.assigned.each(func(t string, p int32) {
		if target.has(t, p) {
			keep.add(t, p)
		} else {
			revoke.add(t, p)
		}
	})
	if len(revoke) > 0 {
		m.assigned, m.revoking = keep, revoke
		m.revokeUntil = time.Now().Add(m.rebalanceTimeout)
		if m.revokeTimer != nil {
			m.revokeTimer.Stop()
		}
		m.revokeTimer = time.AfterFunc(m.rebalanceTimeout, func() { g.revokeExpired(m) })
		return true
	}
	changed := false
	if m.epoch != g.assignmentEpoch {
		m.prevEpoch, m.epoch = m.epoch, g.assignmentEpoch
		changed = true
	}
	target.each(func(t string, p int32) {
		tp := topicPart{t, p}
		if m.assigned.has(t, p) {
			return
		}
		if owner, held := g.owners[tp]; held && owner != m.id {
			return
		}
		g.owners[tp] = m.id
		m.assigned.add(t, p)
		m.since[tp] = m.epoch
		changed = true
	})
	return changed
}

// released records that the member no longer owns anything outside owned:
// what it was revoking and does not list is free.
func (g *cgroup) released(m *cmember, owned assignment) bool {
	if len(m.revoking) == 0 {
		return false
	}
	still := false
	m.revoking.each(func(t string, p int32) {
		if owned.has(t, p) {
			still = true
		}
	})
	if still {
		return false
	}
	m.revoking.each(func(t string, p int32) {
		tp := topicPart{t, p}
		if g.owners[tp] == m.id {
			delete(g.owners, tp)
		}
		delete(m.since, tp)
	})
	m.revoking = assignment{}
	if m.revokeTimer != nil {
		m.revokeTimer.Stop()
	}
	return true
}

// checkCommit decides whether a commit of these partitions by a member of
// the consumer group, at this member epoch, may be stored.
func (g *cgroup) checkCommit(memberID string, epoch int32, newFormat bool, parts []topicPart) int16 {
	m, ok := g.members[memberID]
	if !ok {
		return kerr.UnknownMemberID.Code
	}
	if !newFormat {
		return kerr.UnsupportedVersion.Code
	}
	switch {
	case epoch > m.epoch:
		return kerr.FencedMemberEpoch.Code
	case epoch < m.epoch:
		for _, tp := range parts {
			since, held := m.since[tp]
			if !held || !m.holds(tp.topic, tp.partition) || since > epoch {
				return kerr.StaleMemberEpoch.Code
			}
		}
	}
	return 0
}

// partitionsSubscribed are the topics the group's target covers.
func (g *cgroup) partitionsSubscribed() []string {
	return slices.Sorted(maps.Keys(g.partitions))
}
