package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// cgh is a raw KIP-848 member: it sends ConsumerGroupHeartbeat v1 by hand
// (as a client would), remembering its epoch and what it owns.
type cgh struct {
	t     *testing.T
	rc    *rawConn
	group string
	id    string
	epoch int32
	owned map[string][]int32
}

func newCGH(t *testing.T, addr, group, id string) *cgh {
	return &cgh{t: t, rc: dialRaw(t, addr), group: group, id: id, owned: map[string][]int32{}}
}

func roundTrip[R kmsg.Response](t *testing.T, rc *rawConn, req kmsg.Request) R {
	t.Helper()
	corr := rc.send(req)
	resp := req.ResponseKind()
	if got := rc.recv(resp); got != corr {
		t.Fatalf("correlation %d, want %d", got, corr)
	}
	return resp.(R)
}

// beat sends a heartbeat; join sends the full first request, full a
// request with every field, otherwise only the owned partitions.
func (m *cgh) beat(join bool, topics []string) *kmsg.ConsumerGroupHeartbeatResponse {
	m.t.Helper()
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version = 1
	req.Group, req.MemberID, req.MemberEpoch = m.group, m.id, m.epoch
	if join {
		req.MemberEpoch = 0
		req.RebalanceTimeoutMillis = 5000
		req.SubscribedTopicNames = topics
		assignor := assignorUniform
		req.ServerAssignor = &assignor
	}
	req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
	if !join {
		for _, tn := range slices.Sorted(mapKeys(m.owned)) {
			rt := kmsg.NewConsumerGroupHeartbeatRequestTopic()
			rt.TopicID, rt.Partitions = topicID(tn), m.owned[tn]
			req.Topics = append(req.Topics, rt)
		}
	}
	resp := roundTrip[*kmsg.ConsumerGroupHeartbeatResponse](m.t, m.rc, req)
	if resp.ErrorCode == 0 {
		m.epoch = resp.MemberEpoch
		if resp.Assignment != nil {
			m.owned = map[string][]int32{}
			for _, at := range resp.Assignment.Topics {
				for _, name := range []string{"orders", "audit"} {
					if topicID(name) == at.TopicID {
						m.owned[name] = at.Partitions
					}
				}
			}
		}
	}
	return resp
}

func (m *cgh) mustBeat(join bool, topics ...string) *kmsg.ConsumerGroupHeartbeatResponse {
	m.t.Helper()
	resp := m.beat(join, topics)
	if resp.ErrorCode != 0 {
		m.t.Fatalf("%s heartbeat: %v %v", m.id, kerr.ErrorForCode(resp.ErrorCode), deref(resp.ErrorMessage))
	}
	return resp
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (m *cgh) commit(version int16, epoch int32, topic string, parts ...int32) int16 {
	m.t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version = version
	req.Group, req.MemberID, req.Generation = m.group, m.id, epoch
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = topic
	for _, p := range parts {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset = p, 1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp := roundTrip[*kmsg.OffsetCommitResponse](m.t, m.rc, req)
	return resp.Topics[0].Partitions[0].ErrorCode
}

func describeConsumerGroup(t *testing.T, addr, group string) kmsg.ConsumerGroupDescribeResponseGroup {
	t.Helper()
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Version = 1
	req.Groups = []string{group}
	resp := roundTrip[*kmsg.ConsumerGroupDescribeResponse](t, dialRaw(t, addr), req)
	return resp.Groups[0]
}

func wantCode(t *testing.T, what string, got int16, want *kerr.Error) {
	t.Helper()
	code := int16(0)
	if want != nil {
		code = want.Code
	}
	if got != code {
		t.Fatalf("%s: %v, want %v", what, kerr.ErrorForCode(got), want)
	}
}

// TestConsumerGroupProtocolRaw drives KIP-848 by hand: a second member
// gets a partition only after its owner acknowledged revoking it, commits
// carry the member epoch, a leave hands partitions back, a silent member
// is fenced after the session timeout, and the classic protocol cannot
// join the group (nor the new one a classic group).
func TestConsumerGroupProtocolRaw(t *testing.T) {
	t.Parallel()
	f := setupConsumerGroups(t, 700*time.Millisecond)
	f.createTopic(t, "orders", 4)
	const group = "kip848"

	a := newCGH(t, f.addr, group, "member-a")
	resp := a.mustBeat(true, "orders")
	if resp.HeartbeatIntervalMillis != 100 || a.epoch <= 0 || !slices.Equal(a.owned["orders"], []int32{0, 1, 2, 3}) {
		t.Fatalf("first member: epoch %d interval %d owned %v", a.epoch, resp.HeartbeatIntervalMillis, a.owned)
	}
	epochA := a.epoch

	b := newCGH(t, f.addr, group, "member-b")
	b.mustBeat(true, "orders")
	if b.epoch <= epochA || len(b.owned["orders"]) != 0 {
		t.Fatalf("second member: epoch %d (first %d), owned %v: want a newer epoch and nothing until the first revokes", b.epoch, epochA, b.owned)
	}

	// a is told to revoke two partitions; its epoch stays.
	a.mustBeat(false)
	if a.epoch != epochA || len(a.owned["orders"]) != 2 {
		t.Fatalf("first member after the join: epoch %d owned %v, want epoch %d and two partitions", a.epoch, a.owned, epochA)
	}
	kept := a.owned["orders"]
	revoked := []int32{}
	for p := range int32(4) {
		if !slices.Contains(kept, p) {
			revoked = append(revoked, p)
		}
	}
	// Until a acknowledges, b gets nothing (a keepalive, Topics null,
	// acknowledges nothing).
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version, req.Group, req.MemberID, req.MemberEpoch = 1, group, a.id, a.epoch
	if r := roundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, a.rc, req); r.ErrorCode != 0 || r.MemberEpoch != epochA {
		t.Fatalf("keepalive: %v epoch %d", kerr.ErrorForCode(r.ErrorCode), r.MemberEpoch)
	}
	if b.mustBeat(false); len(b.owned["orders"]) != 0 {
		t.Fatalf("second member got %v before the first acknowledged revoking", b.owned)
	}
	d := describeConsumerGroup(t, f.addr, group)
	if d.ErrorCode != 0 || d.State != "Reconciling" || len(d.Members) != 2 || d.AssignorName != assignorUniform {
		t.Fatalf("describe mid-rebalance: %+v", d)
	}

	// Commits: the member epoch is the generation, v9 is required.
	wantCode(t, "commit at the member's epoch", a.commit(9, a.epoch, "orders", kept...), nil)
	wantCode(t, "commit with OffsetCommit v8", a.commit(8, a.epoch, "orders", kept...), kerr.UnsupportedVersion)
	wantCode(t, "commit with a newer epoch", a.commit(9, a.epoch+5, "orders", kept...), kerr.FencedMemberEpoch)
	wantCode(t, "commit by an unknown member", (&cgh{t: t, rc: a.rc, group: group, id: "nobody"}).commit(9, 1, "orders", 0), kerr.UnknownMemberID)

	// a acknowledges: it moves to the new epoch, b gets the partitions.
	a.owned["orders"] = kept
	a.mustBeat(false)
	if a.epoch != b.epoch {
		t.Fatalf("first member after revoking: epoch %d, want %d", a.epoch, b.epoch)
	}
	b.mustBeat(false)
	if !slices.Equal(b.owned["orders"], revoked) {
		t.Fatalf("second member owns %v, want the revoked %v", b.owned, revoked)
	}
	// An older epoch commits what the member held since then (KIP-1251);
	// a partition given at the newer epoch needs the newer one.
	wantCode(t, "a's commit with its previous epoch of a kept partition", a.commit(9, epochA, "orders", kept...), nil)
	wantCode(t, "b's commit with an epoch before it got the partition", b.commit(9, epochA, "orders", revoked...), kerr.StaleMemberEpoch)
	wantCode(t, "b's commit", b.commit(9, b.epoch, "orders", revoked...), nil)

	d = describeConsumerGroup(t, f.addr, group)
	if d.State != "Stable" || d.Epoch != b.epoch || d.AssignmentEpoch != b.epoch {
		t.Fatalf("describe after the rebalance: %+v", d)
	}
	for _, m := range d.Members {
		if len(m.Assignment.TopicPartitions) != 1 || len(m.Assignment.TopicPartitions[0].Partitions) != 2 || m.MemberEpoch != d.Epoch {
			t.Fatalf("member %+v", m)
		}
	}

	// Epoch errors.
	stale := &cgh{t: t, rc: a.rc, group: group, id: a.id, epoch: a.epoch + 1, owned: a.owned}
	wantCode(t, "heartbeat with a newer epoch", stale.beat(false, nil).ErrorCode, kerr.FencedMemberEpoch)
	stale.epoch = 1
	wantCode(t, "heartbeat with an old epoch", stale.beat(false, nil).ErrorCode, kerr.FencedMemberEpoch)
	ghost := &cgh{t: t, rc: a.rc, group: group, id: "ghost", epoch: 3}
	wantCode(t, "heartbeat of an unknown member", ghost.beat(false, nil).ErrorCode, kerr.UnknownMemberID)

	// The classic protocol cannot join it.
	jg := kmsg.NewPtrJoinGroupRequest()
	jg.Version, jg.Group, jg.SessionTimeoutMillis, jg.RebalanceTimeoutMillis, jg.ProtocolType = 5, group, 6000, 6000, "consumer"
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", []byte{0}
	jg.Protocols = append(jg.Protocols, p)
	wantCode(t, "classic JoinGroup to a consumer group", roundTrip[*kmsg.JoinGroupResponse](t, dialRaw(t, f.addr), jg).ErrorCode, kerr.InconsistentGroupProtocol)

	// b leaves: a gets everything, at a new epoch.
	req = kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version, req.Group, req.MemberID, req.MemberEpoch = 1, group, b.id, -1
	if r := roundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, b.rc, req); r.ErrorCode != 0 || r.MemberEpoch != -1 {
		t.Fatalf("leave: %v epoch %d", kerr.ErrorForCode(r.ErrorCode), r.MemberEpoch)
	}
	before := a.epoch
	a.mustBeat(false)
	if a.epoch <= before || !slices.Equal(a.owned["orders"], []int32{0, 1, 2, 3}) {
		t.Fatalf("after the leave: epoch %d (was %d) owned %v", a.epoch, before, a.owned)
	}

	// a goes silent: after the session timeout the coordinator expires it.
	// Describing does not heartbeat, so asking does not keep a alive.
	describe := dialRaw(t, f.addr)
	testwait.Until(t, 30*time.Second, "a's session to expire", func() error {
		req := kmsg.NewPtrConsumerGroupDescribeRequest()
		req.Version = 1
		req.Groups = []string{group}
		d := roundTrip[*kmsg.ConsumerGroupDescribeResponse](t, describe, req).Groups[0]
		if d.State != "Empty" || len(d.Members) != 0 {
			return fmt.Errorf("state %s with %d members", d.State, len(d.Members))
		}
		return nil
	})
	wantCode(t, "heartbeat after the session timeout", a.beat(false, nil).ErrorCode, kerr.UnknownMemberID)
	if d := describeConsumerGroup(t, f.addr, group); d.State != "Empty" || len(d.Members) != 0 {
		t.Fatalf("describe after everyone left: %+v", d)
	}
	lg := kmsg.NewPtrListGroupsRequest()
	lg.Version = 5
	var listed *kmsg.ListGroupsResponseGroup
	lgr := roundTrip[*kmsg.ListGroupsResponse](t, dialRaw(t, f.addr), lg)
	for i := range lgr.Groups {
		if lgr.Groups[i].Group == group {
			listed = &lgr.Groups[i]
		}
	}
	if listed == nil || listed.GroupType != groupTypeConsumer || listed.ProtocolType != "consumer" || listed.GroupState != "Empty" {
		t.Fatalf("ListGroups: %+v", listed)
	}

	// The new protocol cannot join a classic group that has members.
	f.createTopic(t, "audit", 1)
	jg.Group = "classic"
	jg.MemberID = ""
	jr := roundTrip[*kmsg.JoinGroupResponse](t, dialRaw(t, f.addr), jg)
	if jr.ErrorCode != kerr.MemberIDRequired.Code {
		t.Fatalf("classic join: %v", kerr.ErrorForCode(jr.ErrorCode))
	}
	jg.MemberID = jr.MemberID
	dialRaw(t, f.addr).send(jg) // answered once the generation forms; not read
	waitFor(t, testContext(t, 10*time.Second), "the classic member", func() bool { return f.srv.groups.classicGroupHasMembers("classic") })
	c := newCGH(t, f.addr, "classic", "new-protocol")
	wantCode(t, "ConsumerGroupHeartbeat to a classic group", c.beat(true, []string{"audit"}).ErrorCode, kerr.GroupIDNotFound)
}

// TestConsumerGroupSurvivesRestart: a KIP-848 group in the middle of a
// revocation is saved; after the server and broker restart, the members'
// epochs and assignments are as they were, the partition being revoked is
// still withheld from the new member, and the revocation completes.
func TestConsumerGroupSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := Config{MinSessionTimeout: 500 * time.Millisecond, ConsumerSessionTimeout: 10 * time.Second,
		ConsumerHeartbeatInterval: 100 * time.Millisecond, AutoCreateTopics: true, Logger: testLogger(t)}
	start := func() (string, func()) {
		b, err := broker.Open(context.Background(), broker.Options{Dir: dir, JanitorInterval: -1, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("open broker: %v", err)
		}
		srv, err := NewServer(b, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stop := serve(t, context.Background(), srv, ln, b)
		if _, err := b.CreateTopic("orders", broker.TopicConfig{Partitions: 4}); err != nil && !errors.Is(err, broker.ErrTopicExists) {
			t.Fatalf("create topic: %v", err)
		}
		return ln.Addr().String(), stop
	}
	addr, stop := start()
	a := newCGH(t, addr, "durable", "member-a")
	a.mustBeat(true, "orders")
	b := newCGH(t, addr, "durable", "member-b")
	b.mustBeat(true, "orders")
	a.mustBeat(false) // told to revoke two
	epochA, epochB, kept := a.epoch, b.epoch, slices.Clone(a.owned["orders"])
	stop()

	addr, stop = start()
	defer stop()
	a.rc, b.rc = dialRaw(t, addr), dialRaw(t, addr)
	d := describeConsumerGroup(t, addr, "durable")
	if d.ErrorCode != 0 || len(d.Members) != 2 || d.State != "Reconciling" {
		t.Fatalf("restored group: %+v", d)
	}
	wantCode(t, "a's commit after the restart", a.commit(9, epochA, "orders", kept...), nil)
	if b.mustBeat(false); b.epoch != epochB || len(b.owned["orders"]) != 0 {
		t.Fatalf("b after the restart: epoch %d (was %d), owned %v: want nothing before a revokes", b.epoch, epochB, b.owned)
	}
	a.owned["orders"] = kept
	a.mustBeat(false)
	b.mustBeat(false)
	if a.epoch != epochB || len(b.owned["orders"]) != 2 {
		t.Fatalf("after the revocation: a epoch %d, b owns %v", a.epoch, b.owned)
	}
}

// TestConsumerGroupStaticMember: an instance id held by a live member
// cannot be taken (UNRELEASED_INSTANCE_ID); after the member leaves with
// epoch -2 a new member id with the same instance takes over its
// assignment without the others' partitions moving.
func TestConsumerGroupStaticMember(t *testing.T) {
	t.Parallel()
	f := setupConsumerGroups(t, 10*time.Second)
	f.createTopic(t, "orders", 2)
	const group = "static848"
	instance := "worker-1"
	join := func(id string) (*cgh, *kmsg.ConsumerGroupHeartbeatResponse) {
		m := newCGH(t, f.addr, group, id)
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Version, req.Group, req.MemberID, req.MemberEpoch = 1, group, id, 0
		req.InstanceID, req.RebalanceTimeoutMillis, req.SubscribedTopicNames = &instance, 5000, []string{"orders"}
		req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		resp := roundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, m.rc, req)
		if resp.ErrorCode == 0 {
			m.epoch = resp.MemberEpoch
			if resp.Assignment != nil && len(resp.Assignment.Topics) > 0 {
				m.owned["orders"] = resp.Assignment.Topics[0].Partitions
			}
		}
		return m, resp
	}
	a, resp := join("static-a")
	wantCode(t, "static join", resp.ErrorCode, nil)
	if !slices.Equal(a.owned["orders"], []int32{0, 1}) {
		t.Fatalf("static member owns %v", a.owned)
	}
	_, resp = join("static-b")
	wantCode(t, "a second member id for a held instance", resp.ErrorCode, kerr.UnreleasedInstanceID)

	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version, req.Group, req.MemberID, req.MemberEpoch, req.InstanceID = 1, group, a.id, -2, &instance
	if r := roundTrip[*kmsg.ConsumerGroupHeartbeatResponse](t, a.rc, req); r.ErrorCode != 0 || r.MemberEpoch != -2 {
		t.Fatalf("static leave: %v epoch %d", kerr.ErrorForCode(r.ErrorCode), r.MemberEpoch)
	}
	d := describeConsumerGroup(t, f.addr, group)
	if len(d.Members) != 1 {
		t.Fatalf("after a static leave the member is kept for its instance: %+v", d)
	}
	b, resp := join("static-c")
	wantCode(t, "the instance rejoining under a new member id", resp.ErrorCode, nil)
	if b.epoch != a.epoch || !slices.Equal(b.owned["orders"], []int32{0, 1}) {
		t.Fatalf("the rejoined instance: epoch %d (was %d), owns %v", b.epoch, a.epoch, b.owned)
	}
	wantCode(t, "the old member id after the takeover", a.beat(false, nil).ErrorCode, kerr.UnknownMemberID)
	d = describeConsumerGroup(t, f.addr, group)
	if len(d.Members) != 1 || d.Members[0].MemberID != "static-c" || d.State != "Stable" {
		t.Fatalf("after the takeover: %+v", d)
	}
}
