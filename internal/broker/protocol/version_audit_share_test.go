package protocol

import (
	"fmt"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The share groups' (KIP-932) audit cases. Each uses its own group on the
// audit topic, whose partition 0 holds auditRecords records.

// shareStartAt sets group's share start offset of audit's partition 0
// with AlterShareGroupOffsets v0, and returns the answer's error code and
// the partition's.
func shareStartAt(t *testing.T, rc *rawConn, group string, offset int64) (int16, int16) {
	t.Helper()
	req := kmsg.NewPtrAlterShareGroupOffsetsRequest()
	req.Version, req.GroupID = 0, group
	rt := kmsg.NewAlterShareGroupOffsetsRequestTopic()
	rt.Topic = "audit"
	rp := kmsg.NewAlterShareGroupOffsetsRequestTopicPartition()
	rp.Partition, rp.StartOffset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := ask[*kmsg.AlterShareGroupOffsetsResponse](t, rc, req)
	if resp.ErrorCode != 0 {
		return resp.ErrorCode, 0
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 || resp.Topics[0].TopicID != topicID("audit") {
		t.Fatalf("alter share group offsets: %+v", resp.Topics)
	}
	return 0, resp.Topics[0].Partitions[0].ErrorCode
}

// shareJoin joins group as member (a client-made id, KIP-932) with
// ShareGroupHeartbeat v, subscribed to audit.
func shareJoin(t *testing.T, rc *rawConn, v int16, group, member string) *kmsg.ShareGroupHeartbeatResponse {
	t.Helper()
	req := kmsg.NewPtrShareGroupHeartbeatRequest()
	req.Version, req.GroupID, req.MemberID, req.MemberEpoch = v, group, member, 0
	rack := "rack-a"
	req.RackID, req.SubscribedTopicNames = &rack, []string{"audit"}
	resp := ask[*kmsg.ShareGroupHeartbeatResponse](t, rc, req)
	want(t, resp.ErrorCode, "share group heartbeat")
	return resp
}

// shareFetchAt sends ShareFetch v for audit's partition 0 at the session
// epoch, acknowledging acks, and returns the answer and the partition's
// answer (nil without one).
func shareFetchAt(t *testing.T, rc *rawConn, v int16, group, member string, epoch, maxRecords int32, renew bool, acks ...kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch) (*kmsg.ShareFetchResponse, *kmsg.ShareFetchResponseTopicPartition) {
	t.Helper()
	req := kmsg.NewPtrShareFetchRequest()
	req.Version, req.GroupID, req.MemberID, req.ShareSessionEpoch = v, &group, &member, epoch
	req.MaxBytes, req.MaxRecords, req.BatchSize = 1<<20, maxRecords, maxRecords
	req.IsRenewAck = renew
	if renew {
		// KIP-1222: a renewing ShareFetch has its fetch parameters zero.
		req.MaxWaitMillis, req.MinBytes, req.MaxBytes, req.MaxRecords = 0, 0, 0, 0
	}
	if v >= 2 {
		req.ShareAcquireMode = 1 // record limit
	}
	rt := kmsg.NewShareFetchRequestTopic()
	rt.TopicID = topicID("audit")
	rp := kmsg.NewShareFetchRequestTopicPartition()
	rp.AcknowledgementBatches = acks
	if !renew {
		rp.PartitionMaxBytes = 1 << 20
	}
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := ask[*kmsg.ShareFetchResponse](t, rc, req)
	if resp.ErrorCode != 0 || len(resp.Topics) == 0 {
		return resp, nil
	}
	if len(resp.Topics) != 1 || resp.Topics[0].TopicID != topicID("audit") || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("share fetch v%d: topics %+v", v, resp.Topics)
	}
	return resp, &resp.Topics[0].Partitions[0]
}

// acked is one acknowledgement batch of type typ for first..last.
func acked(first, last int64, typ int8) kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch {
	b := kmsg.NewShareFetchRequestTopicPartitionAcknowledgementBatch()
	b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{typ}
	return b
}

// wantAcquired fails t unless p acquired exactly the ranges in want
// ("[first-last]xcount").
func wantAcquired(t *testing.T, p *kmsg.ShareFetchResponseTopicPartition, want string) {
	t.Helper()
	if p == nil {
		if want != "" {
			t.Fatalf("acquired nothing, want %s", want)
		}
		return
	}
	if p.ErrorCode != 0 || p.AcknowledgeErrorCode != 0 {
		t.Fatalf("partition %v, acknowledgement %v", kerr.ErrorForCode(p.ErrorCode), kerr.ErrorForCode(p.AcknowledgeErrorCode))
	}
	if got := ranges(p.AcquiredRecords); got != want {
		t.Fatalf("acquired %s, want %s", got, want)
	}
	if want != "" && len(p.Records) == 0 {
		t.Fatal("acquired records without their batches")
	}
}

// auditShareGroupHeartbeat (v1, the first stable version): a member with
// a client-made id is assigned every partition of its topic, with the
// heartbeat interval; epoch -1 leaves, after which its old epoch is
// UNKNOWN_MEMBER_ID; a first heartbeat without a subscription is
// INVALID_REQUEST.
func auditShareGroupHeartbeat(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("sgh-v", v)
	resp := shareJoin(t, rc, v, group, "m1")
	if resp.MemberID == nil || *resp.MemberID != "m1" || resp.MemberEpoch < 1 || resp.HeartbeatIntervalMillis != 100 {
		t.Fatalf("member %v epoch %d interval %d", resp.MemberID, resp.MemberEpoch, resp.HeartbeatIntervalMillis)
	}
	if as := resp.Assignment; as == nil || len(as.TopicPartitions) != 1 || as.TopicPartitions[0].TopicID != topicID("audit") ||
		!slices.Equal(slices.Sorted(slices.Values(as.TopicPartitions[0].Partitions)), []int32{0, 1, 2}) {
		t.Fatalf("assignment %+v, want audit's 3 partitions", resp.Assignment)
	}
	epoch := resp.MemberEpoch

	leave := kmsg.NewPtrShareGroupHeartbeatRequest()
	leave.Version, leave.GroupID, leave.MemberID, leave.MemberEpoch = v, group, "m1", -1
	left := ask[*kmsg.ShareGroupHeartbeatResponse](t, rc, leave)
	want(t, left.ErrorCode, "share group leave")
	if left.MemberEpoch != -1 {
		t.Fatalf("leave answered epoch %d, want -1", left.MemberEpoch)
	}
	again := kmsg.NewPtrShareGroupHeartbeatRequest()
	again.Version, again.GroupID, again.MemberID, again.MemberEpoch = v, group, "m1", epoch
	if got := ask[*kmsg.ShareGroupHeartbeatResponse](t, rc, again).ErrorCode; got != kerr.UnknownMemberID.Code {
		t.Fatalf("heartbeat after leaving: %v, want UNKNOWN_MEMBER_ID", kerr.ErrorForCode(got))
	}
	bare := kmsg.NewPtrShareGroupHeartbeatRequest()
	bare.Version, bare.GroupID, bare.MemberID = v, group, "m2"
	if got := ask[*kmsg.ShareGroupHeartbeatResponse](t, rc, bare).ErrorCode; got != kerr.InvalidRequest.Code {
		t.Fatalf("first heartbeat without a subscription: %v, want INVALID_REQUEST", kerr.ErrorForCode(got))
	}
}

// auditShareGroupDescribe (v1): a share group with its member (rack,
// client id, subscription, assignment by topic name and id) and the
// simple assignor; an unknown group is GROUP_ID_NOT_FOUND.
func auditShareGroupDescribe(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("sgd-v", v)
	hb := shareJoin(t, rc, 1, group, "m1")
	req := kmsg.NewPtrShareGroupDescribeRequest()
	req.Version, req.GroupIDs = v, []string{group, group + "-missing"}
	resp := ask[*kmsg.ShareGroupDescribeResponse](t, rc, req)
	if len(resp.Groups) != 2 {
		t.Fatalf("%d groups, want 2", len(resp.Groups))
	}
	g := resp.Groups[0]
	want(t, g.ErrorCode, "share group describe")
	if g.GroupID != group || g.GroupState != "Stable" || g.Assignor != "simple" || g.GroupEpoch < hb.MemberEpoch || len(g.Members) != 1 {
		t.Fatalf("group %+v", g)
	}
	m := g.Members[0]
	if m.MemberID != "m1" || m.MemberEpoch != hb.MemberEpoch || m.RackID == nil || *m.RackID != "rack-a" || m.ClientID != "test" ||
		m.ClientHost == "" || !slices.Equal(m.SubscribedTopicNames, []string{"audit"}) {
		t.Fatalf("member %+v", m)
	}
	if tps := m.Assignment.TopicPartitions; len(tps) != 1 || tps[0].Topic != "audit" || tps[0].TopicID != topicID("audit") || len(tps[0].Partitions) != 3 {
		t.Fatalf("member assignment %+v", tps)
	}
	if got := resp.Groups[1].ErrorCode; got != kerr.GroupIDNotFound.Code {
		t.Fatalf("unknown group: %v, want GROUP_ID_NOT_FOUND", kerr.ErrorForCode(got))
	}
}

// auditShareFetch: records are acquired from the share start offset up to
// MaxRecords (v1+), with their batches, under the lock duration (v1+ in
// the answer); acknowledgements ride on the next fetch, and an accepted
// record is not delivered again. v2 adds the acquire mode (record limit
// served exactly) and renewing acknowledgements (KIP-1222), whose fetch
// acquires nothing. A fetch at a wrong session epoch is
// INVALID_SHARE_SESSION_EPOCH.
func auditShareFetch(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("sf-v", v)
	if code, pcode := shareStartAt(t, rc, group, 0); code != 0 || pcode != 0 {
		t.Fatalf("share start: %v / %v", kerr.ErrorForCode(code), kerr.ErrorForCode(pcode))
	}
	shareJoin(t, rc, 1, group, "m1")

	resp, p := shareFetchAt(t, rc, v, group, "m1", 0, 2, false)
	want(t, resp.ErrorCode, "share fetch")
	if resp.AcquisitionLockTimeoutMillis != 30000 {
		t.Fatalf("lock timeout %d, want 30000", resp.AcquisitionLockTimeoutMillis)
	}
	wantAcquired(t, p, "[0-1]x1")

	resp, p = shareFetchAt(t, rc, v, group, "m1", 1, 10, false, acked(0, 1, ackAccept))
	want(t, resp.ErrorCode, "share fetch")
	wantAcquired(t, p, fmt.Sprintf("[2-%d]x1", auditRecords-1))

	if got, _ := shareFetchAt(t, rc, v, group, "m1", 7, 10, false); got.ErrorCode != kerr.InvalidShareSessionEpoch.Code {
		t.Fatalf("wrong session epoch: %v, want INVALID_SHARE_SESSION_EPOCH", kerr.ErrorForCode(got.ErrorCode))
	}
	// v2: a renewing acknowledgement fetches nothing, though the record it
	// releases is available; the renewed records stay the member's.
	again := ""
	if v >= 2 {
		// With a fetch parameter set it is INVALID_REQUEST, and the session
		// epoch does not move.
		bad := kmsg.NewPtrShareFetchRequest()
		bad.Version, bad.GroupID, bad.MemberID, bad.ShareSessionEpoch, bad.IsRenewAck = v, &group, kmsg.StringPtr("m1"), 2, true
		bad.MaxRecords = 10
		if got := ask[*kmsg.ShareFetchResponse](t, rc, bad); got.ErrorCode != kerr.InvalidRequest.Code {
			t.Fatalf("renewing share fetch with MaxRecords 10: %v, want INVALID_REQUEST", kerr.ErrorForCode(got.ErrorCode))
		}
		resp, p = shareFetchAt(t, rc, v, group, "m1", 2, 10, true, acked(2, 2, ackRelease), acked(3, auditRecords-1, ackRenew))
		want(t, resp.ErrorCode, "renewing share fetch")
		if p == nil || p.AcknowledgeErrorCode != 0 || len(p.AcquiredRecords) != 0 || len(p.Records) != 0 {
			t.Fatalf("renewing acknowledgement answered %+v, want acknowledged and nothing acquired", p)
		}
		again = "[2-2]x2"
	}

	// A new session of the same member: 0-1 are accepted and not delivered
	// again, the rest it still holds; at v2 the released record comes back.
	resp, p = shareFetchAt(t, rc, v, group, "m1", 0, 10, false)
	want(t, resp.ErrorCode, "share fetch")
	wantAcquired(t, p, again)
}

// auditShareAcknowledge: acknowledgements outside a fetch are applied
// (accepted records are gone, a released one comes back with delivery
// count 2); v2 answers the lock duration and takes renewing
// acknowledgements (KIP-1222). Epoch 0 is INVALID_SHARE_SESSION_EPOCH (it
// cannot open a session).
func auditShareAcknowledge(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("sa-v", v)
	if code, pcode := shareStartAt(t, rc, group, 0); code != 0 || pcode != 0 {
		t.Fatalf("share start: %v / %v", kerr.ErrorForCode(code), kerr.ErrorForCode(pcode))
	}
	shareJoin(t, rc, 1, group, "m1")
	resp, p := shareFetchAt(t, rc, 1, group, "m1", 0, 10, false)
	want(t, resp.ErrorCode, "share fetch")
	wantAcquired(t, p, fmt.Sprintf("[0-%d]x1", auditRecords-1))

	ack := func(epoch int32, renew bool, batches ...kmsg.ShareAcknowledgeRequestTopicPartitionAcknowledgementBatch) *kmsg.ShareAcknowledgeResponse {
		req := kmsg.NewPtrShareAcknowledgeRequest()
		member := "m1"
		req.Version, req.GroupID, req.MemberID, req.ShareSessionEpoch, req.IsRenewAck = v, &group, &member, epoch, renew
		rt := kmsg.NewShareAcknowledgeRequestTopic()
		rt.TopicID = topicID("audit")
		rp := kmsg.NewShareAcknowledgeRequestTopicPartition()
		rp.AcknowledgementBatches = batches
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		return ask[*kmsg.ShareAcknowledgeResponse](t, rc, req)
	}
	batch := func(first, last int64, typ int8) kmsg.ShareAcknowledgeRequestTopicPartitionAcknowledgementBatch {
		b := kmsg.NewShareAcknowledgeRequestTopicPartitionAcknowledgementBatch()
		b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{typ}
		return b
	}
	partitionCode := func(r *kmsg.ShareAcknowledgeResponse) int16 {
		t.Helper()
		want(t, r.ErrorCode, "share acknowledge")
		if len(r.Topics) != 1 || r.Topics[0].TopicID != topicID("audit") || len(r.Topics[0].Partitions) != 1 {
			t.Fatalf("share acknowledge topics %+v", r.Topics)
		}
		return r.Topics[0].Partitions[0].ErrorCode
	}

	if got := ack(0, false, batch(0, 1, ackAccept)).ErrorCode; got != kerr.InvalidShareSessionEpoch.Code {
		t.Fatalf("acknowledge at epoch 0: %v, want INVALID_SHARE_SESSION_EPOCH", kerr.ErrorForCode(got))
	}
	r := ack(1, false, batch(0, 1, ackAccept), batch(2, 2, ackRelease))
	want(t, partitionCode(r), "accept and release")
	if wantLock := map[bool]int32{true: 30000, false: 0}[v >= 2]; r.AcquisitionLockTimeoutMillis != wantLock {
		t.Fatalf("lock timeout %d, want %d", r.AcquisitionLockTimeoutMillis, wantLock)
	}
	if got := partitionCode(ack(2, false, batch(0, 0, ackAccept))); got != kerr.InvalidRecordState.Code {
		t.Fatalf("acknowledging an accepted record: %v, want INVALID_RECORD_STATE", kerr.ErrorForCode(got))
	}
	if v >= 2 {
		want(t, partitionCode(ack(3, true, batch(3, auditRecords-1, ackRenew))), "renewing acknowledgement")
	}

	// A new session: only the released record comes back, delivered twice.
	resp, p = shareFetchAt(t, rc, 1, group, "m1", 0, 10, false)
	want(t, resp.ErrorCode, "share fetch")
	wantAcquired(t, p, "[2-2]x2")
}

// describeShareOffsets asks DescribeShareGroupOffsets v for group's
// partitions of audit (all it has state for when parts is nil).
func describeShareOffsets(t *testing.T, rc *rawConn, v int16, group string, parts []int32) kmsg.DescribeShareGroupOffsetsResponseGroup {
	t.Helper()
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	req.Version = v
	rg := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	rg.GroupID = group
	if parts != nil {
		rt := kmsg.NewDescribeShareGroupOffsetsRequestGroupTopic()
		rt.Topic, rt.Partitions = "audit", parts
		rg.Topics = append(rg.Topics, rt)
	}
	req.Groups = append(req.Groups, rg)
	resp := ask[*kmsg.DescribeShareGroupOffsetsResponse](t, rc, req)
	if len(resp.Groups) != 1 || resp.Groups[0].GroupID != group {
		t.Fatalf("describe share group offsets: %+v", resp.Groups)
	}
	want(t, resp.Groups[0].ErrorCode, "describe share group offsets")
	return resp.Groups[0]
}

// auditDescribeShareGroupOffsets: the share start offset of each partition
// asked (-1 without state), or of every partition with state when no
// topics are named; v1 adds the lag: the log past the share partition's
// end plus the records in flight.
func auditDescribeShareGroupOffsets(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("dsgo-v", v)
	if code, pcode := shareStartAt(t, rc, group, 2); code != 0 || pcode != 0 {
		t.Fatalf("share start: %v / %v", kerr.ErrorForCode(code), kerr.ErrorForCode(pcode))
	}
	g := describeShareOffsets(t, rc, v, group, []int32{0, 1})
	if len(g.Topics) != 1 || g.Topics[0].Topic != "audit" || g.Topics[0].TopicID != topicID("audit") || len(g.Topics[0].Partitions) != 2 {
		t.Fatalf("topics %+v", g.Topics)
	}
	p0, p1 := g.Topics[0].Partitions[0], g.Topics[0].Partitions[1]
	if p0.Partition != 0 || p0.StartOffset != 2 || p0.ErrorCode != 0 || p1.Partition != 1 || p1.StartOffset != -1 || p1.ErrorCode != 0 {
		t.Fatalf("partitions %+v", g.Topics[0].Partitions)
	}
	if v >= 1 && (p0.Lag != auditRecords-2 || p1.Lag != -1) {
		t.Fatalf("lag %d and %d, want %d and -1", p0.Lag, p1.Lag, auditRecords-2)
	}
	all := describeShareOffsets(t, rc, v, group, nil)
	if len(all.Topics) != 1 || len(all.Topics[0].Partitions) != 1 || all.Topics[0].Partitions[0].StartOffset != 2 {
		t.Fatalf("all partitions with state: %+v", all.Topics)
	}
}

// auditAlterShareGroupOffsets (v0): a member-less group's share start
// offset is set (and read back); an offset past the log is
// INVALID_REQUEST for that partition; a group with members is
// NON_EMPTY_GROUP.
func auditAlterShareGroupOffsets(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("asgo-v", v)
	if code, pcode := shareStartAt(t, rc, group, 3); code != 0 || pcode != 0 {
		t.Fatalf("share start: %v / %v", kerr.ErrorForCode(code), kerr.ErrorForCode(pcode))
	}
	if p := describeShareOffsets(t, rc, 1, group, []int32{0}).Topics[0].Partitions[0]; p.StartOffset != 3 || p.Lag != auditRecords-3 {
		t.Fatalf("after altering: %+v", p)
	}
	if _, pcode := shareStartAt(t, rc, group, auditRecords+1); pcode != kerr.InvalidRequest.Code {
		t.Fatalf("start past the log: %v, want INVALID_REQUEST", kerr.ErrorForCode(pcode))
	}
	shareJoin(t, rc, 1, group, "m1")
	if code, _ := shareStartAt(t, rc, group, 0); code != kerr.NonEmptyGroup.Code {
		t.Fatalf("altering a group with members: %v, want NON_EMPTY_GROUP", kerr.ErrorForCode(code))
	}
}

// auditDeleteShareGroupOffsets (v0): a member-less group's share state of
// a topic is forgotten; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION, an
// unknown group GROUP_ID_NOT_FOUND.
func auditDeleteShareGroupOffsets(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("dlsgo-v", v)
	if code, pcode := shareStartAt(t, rc, group, 3); code != 0 || pcode != 0 {
		t.Fatalf("share start: %v / %v", kerr.ErrorForCode(code), kerr.ErrorForCode(pcode))
	}
	del := func(group string, topics ...string) *kmsg.DeleteShareGroupOffsetsResponse {
		req := kmsg.NewPtrDeleteShareGroupOffsetsRequest()
		req.Version, req.GroupID = v, group
		for _, name := range topics {
			rt := kmsg.NewDeleteShareGroupOffsetsRequestTopic()
			rt.Topic = name
			req.Topics = append(req.Topics, rt)
		}
		return ask[*kmsg.DeleteShareGroupOffsetsResponse](t, rc, req)
	}
	resp := del(group, "audit", "no-such-topic")
	want(t, resp.ErrorCode, "delete share group offsets")
	if len(resp.Topics) != 2 || resp.Topics[0].Topic != "audit" || resp.Topics[0].TopicID != topicID("audit") || resp.Topics[0].ErrorCode != 0 ||
		resp.Topics[1].ErrorCode != kerr.UnknownTopicOrPartition.Code {
		t.Fatalf("topics %+v", resp.Topics)
	}
	if p := describeShareOffsets(t, rc, 1, group, []int32{0}).Topics[0].Partitions[0]; p.StartOffset != -1 {
		t.Fatalf("after deleting: start offset %d, want -1", p.StartOffset)
	}
	if got := del(group+"-missing", "audit").ErrorCode; got != kerr.GroupIDNotFound.Code {
		t.Fatalf("unknown group: %v, want GROUP_ID_NOT_FOUND", kerr.ErrorForCode(got))
	}
}
