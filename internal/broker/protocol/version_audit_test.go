package protocol

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// auditCase drives one API at each version of from..to, as a client of
// that version sends it, and asserts what the handler does with the fields
// that version adds (docs/kafka-compatibility.md, "Per-version audit").
type auditCase struct {
	key      kmsg.Key
	from, to int16
	run      func(t *testing.T, a *audit, v int16)
}

// audit is the listeners the cases share: a default one with the topic
// "audit" (3 partitions, auditRecords records on partition 0), one with
// SASL, and one with an Authorizer whose super user is the anonymous
// principal.
type audit struct {
	f, sasl, acl *fixture
}

const auditRecords = 5

// TestEveryAdvertisedVersionAudited: for every API and version the
// listener advertises there is exactly one case, and it passes: a request
// at that version is answered as that version defines each of its fields,
// or with the refusal the compatibility docs list. A version advertised
// without a case fails here.
func TestEveryAdvertisedVersionAudited(t *testing.T) {
	t.Parallel()
	cases := auditCases()
	covered := map[int16]map[int16]int{}
	for _, c := range cases {
		if covered[c.key.Int16()] == nil {
			covered[c.key.Int16()] = map[int16]int{}
		}
		for v := c.from; v <= c.to; v++ {
			covered[c.key.Int16()][v]++
		}
	}
	for key, r := range supportedVersions {
		for v := r.min; v <= r.max; v++ {
			if n := covered[key][v]; n != 1 {
				t.Errorf("%s v%d is advertised and has %d audit cases, want 1", kmsg.NameForKey(key), v, n)
			}
		}
		for v := range covered[key] {
			if v < r.min || v > r.max {
				t.Errorf("%s v%d has an audit case but is not advertised", kmsg.NameForKey(key), v)
			}
		}
	}
	for key := range covered {
		if _, ok := supportedVersions[key]; !ok {
			t.Errorf("%s has audit cases but is not advertised", kmsg.NameForKey(key))
		}
	}
	if t.Failed() {
		return
	}

	a := newAudit(t)
	for _, c := range cases {
		for v := c.from; v <= c.to; v++ {
			t.Run(fmt.Sprintf("%s/v%d", c.key.Name(), v), func(t *testing.T) {
				t.Parallel()
				c.run(t, a, v)
			})
		}
	}
}

func newAudit(t *testing.T) *audit {
	f := setup(t, func(c *Config) {
		c.ConsumerSessionTimeout = 10 * time.Second
		c.ConsumerHeartbeatInterval = 100 * time.Millisecond
	})
	f.createTopic(t, "audit", 3)
	t0 := time.Now().Add(-time.Hour)
	for i := range auditRecords {
		batch := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte(fmt.Sprint("r", i)), Timestamp: t0.Add(time.Duration(i) * time.Second)}})
		if _, err := f.b.Append(context.Background(), "audit", 0, batch); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.b.CreateTopic("audit-compact", broker.TopicConfig{Partitions: 1, CleanupPolicy: broker.CleanupCompact}); err != nil {
		t.Fatal(err)
	}
	sasl := setupSASL(t, map[string]string{"audit": "audit-pw"}, func(c *Config) { c.TLS = nil })
	authz, err := NewAuthorizer(AuthorizerConfig{File: filepath.Join(t.TempDir(), "acls.json"), SuperUsers: []string{"User:ANONYMOUS"}})
	if err != nil {
		t.Fatal(err)
	}
	acl := setup(t, func(c *Config) { c.Authorizer = authz })
	return &audit{f: f, sasl: sasl.fixture, acl: acl}
}

// ask sends req (its version set) on rc and returns the answer, decoded at
// that version.
func ask[R kmsg.Response](t *testing.T, rc *rawConn, req kmsg.Request) R {
	t.Helper()
	corr := rc.send(req)
	resp := req.ResponseKind()
	if got := rc.recv(resp); got != corr {
		t.Fatalf("%s v%d: correlation id %d, want %d", kmsg.NameForKey(req.Key()), req.GetVersion(), got, corr)
	}
	return resp.(R)
}

// want fails t with what unless code is 0.
func want(t *testing.T, code int16, what string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("%s: %v", what, kerr.ErrorForCode(code))
	}
}

// allOps is the authorized-operations bit set of every op in ops.
func allOps(ops []kmsg.ACLOperation) int32 {
	var bits int32
	for _, op := range ops {
		bits |= 1 << int(op)
	}
	return bits
}

func auditCases() []auditCase {
	return []auditCase{
		{kmsg.Produce, 3, 9, auditProduce},
		{kmsg.Fetch, 4, 13, auditFetch},
		{kmsg.ListOffsets, 0, 10, auditListOffsets},
		{kmsg.Metadata, 0, 12, auditMetadata},
		{kmsg.OffsetCommit, 0, 9, auditOffsetCommit},
		{kmsg.OffsetFetch, 0, 8, auditOffsetFetch},
		{kmsg.FindCoordinator, 0, 4, auditFindCoordinator},
		{kmsg.JoinGroup, 0, 9, auditJoinGroup},
		{kmsg.Heartbeat, 0, 4, auditHeartbeat},
		{kmsg.LeaveGroup, 0, 5, auditLeaveGroup},
		{kmsg.SyncGroup, 0, 5, auditSyncGroup},
		{kmsg.DescribeGroups, 0, 5, auditDescribeGroups},
		{kmsg.ListGroups, 0, 5, auditListGroups},
		{kmsg.SASLHandshake, 0, 1, auditSASLHandshake},
		{kmsg.ApiVersions, 0, 3, auditApiVersions},
		{kmsg.CreateTopics, 0, 7, auditCreateTopics},
		{kmsg.DeleteTopics, 0, 6, auditDeleteTopics},
		{kmsg.DeleteRecords, 0, 2, auditDeleteRecords},
		{kmsg.InitProducerID, 0, 4, auditInitProducerID},
		{kmsg.AddPartitionsToTxn, 0, 3, auditTxn(kmsg.AddPartitionsToTxn)},
		{kmsg.AddOffsetsToTxn, 0, 3, auditTxn(kmsg.AddOffsetsToTxn)},
		{kmsg.EndTxn, 0, 3, auditTxn(kmsg.EndTxn)},
		{kmsg.TxnOffsetCommit, 0, 3, auditTxn(kmsg.TxnOffsetCommit)},
		{kmsg.DescribeACLs, 0, 3, auditACLs(kmsg.DescribeACLs)},
		{kmsg.CreateACLs, 0, 3, auditACLs(kmsg.CreateACLs)},
		{kmsg.DeleteACLs, 0, 3, auditACLs(kmsg.DeleteACLs)},
		{kmsg.DescribeConfigs, 0, 4, auditDescribeConfigs},
		{kmsg.AlterConfigs, 0, 2, auditAlterConfigs},
		{kmsg.DescribeLogDirs, 0, 4, auditDescribeLogDirs},
		{kmsg.SASLAuthenticate, 0, 2, auditSASLAuthenticate},
		{kmsg.CreatePartitions, 0, 3, auditCreatePartitions},
		{kmsg.DeleteGroups, 0, 3, auditDeleteGroups},
		{kmsg.IncrementalAlterConfigs, 0, 1, auditIncrementalAlterConfigs},
		{kmsg.OffsetDelete, 0, 0, auditOffsetDelete},
		{kmsg.DescribeCluster, 0, 2, auditDescribeCluster},
		{kmsg.DescribeTransactions, 0, 0, auditDescribeTransactions},
		{kmsg.ListTransactions, 0, 1, auditListTransactions},
		{kmsg.ConsumerGroupHeartbeat, 0, 1, auditConsumerGroupHeartbeat},
		{kmsg.ConsumerGroupDescribe, 0, 1, auditConsumerGroupDescribe},
		{kmsg.ShareGroupHeartbeat, 1, 1, auditShareGroupHeartbeat},
		{kmsg.ShareGroupDescribe, 1, 1, auditShareGroupDescribe},
		{kmsg.ShareFetch, 1, 2, auditShareFetch},
		{kmsg.ShareAcknowledge, 1, 2, auditShareAcknowledge},
		{kmsg.DescribeShareGroupOffsets, 0, 1, auditDescribeShareGroupOffsets},
		{kmsg.AlterShareGroupOffsets, 0, 0, auditAlterShareGroupOffsets},
		{kmsg.DeleteShareGroupOffsets, 0, 0, auditDeleteShareGroupOffsets},
	}
}

func produceReq(v int16, topic string, batch []byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = v, -1, 5000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = batch
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// auditProduce: the batch is appended at its offset; v5+ reports the log
// start offset; v8+ names the keyless record a compacted topic refuses.
func auditProduce(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	topic := fmt.Sprint("produce-v", v)
	a.f.createTopic(t, topic, 1)
	for i := range int64(2) {
		resp := ask[*kmsg.ProduceResponse](t, rc, produceReq(v, topic, relayBatch("x")))
		p := resp.Topics[0].Partitions[0]
		want(t, p.ErrorCode, "produce")
		if p.BaseOffset != i {
			t.Fatalf("base offset %d, want %d", p.BaseOffset, i)
		}
		if wantStart := map[bool]int64{true: 0, false: -1}[v >= 5]; p.LogStartOffset != wantStart {
			t.Fatalf("log start offset %d, want %d", p.LogStartOffset, wantStart)
		}
	}
	keyless := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: []byte("k"), Value: []byte("a")}, {Value: []byte("b")}})
	resp := ask[*kmsg.ProduceResponse](t, rc, produceReq(v, "audit-compact", keyless))
	p := resp.Topics[0].Partitions[0]
	if p.ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("keyless record to a compacted topic: %v, want INVALID_RECORD", kerr.ErrorForCode(p.ErrorCode))
	}
	if v >= 8 && (len(p.ErrorRecords) != 1 || p.ErrorRecords[0].RelativeOffset != 1 || p.ErrorMessage == nil) {
		t.Fatalf("v8+ record errors %+v (message %v), want record 1", p.ErrorRecords, p.ErrorMessage)
	}
}

// auditFetch: records from offset 0 with the high watermark and last
// stable offset; v5+ the log start offset; v7+ a new fetch session; v11+
// no preferred read replica (one node); v13+ topics by id, an unknown id
// answered UNKNOWN_TOPIC_ID.
func auditFetch(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = v, 100, 1, 1<<20
	req.IsolationLevel = 1
	req.SessionEpoch = 0
	for _, name := range []string{"audit", "no-such-topic"} {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic, rt.TopicID = name, topicID(name)
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.PartitionMaxBytes = 1 << 20
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
	}
	resp := ask[*kmsg.FetchResponse](t, rc, req)
	want(t, resp.ErrorCode, "fetch")
	if len(resp.Topics) != 2 {
		t.Fatalf("topics %+v", resp.Topics)
	}
	i := slices.IndexFunc(resp.Topics, func(rt kmsg.FetchResponseTopic) bool { return rt.Topic == "audit" || rt.TopicID == topicID("audit") })
	if i < 0 {
		t.Fatalf("audit not answered: %+v", resp.Topics)
	}
	if wantCode := map[bool]int16{true: kerr.UnknownTopicID.Code, false: kerr.UnknownTopicOrPartition.Code}[v >= 13]; resp.Topics[1-i].Partitions[0].ErrorCode != wantCode {
		t.Fatalf("unknown topic: %v, want %v", kerr.ErrorForCode(resp.Topics[1-i].Partitions[0].ErrorCode), kerr.ErrorForCode(wantCode))
	}
	if v >= 13 && (resp.Topics[i].TopicID != topicID("audit") || resp.Topics[1-i].TopicID != topicID("no-such-topic")) {
		t.Fatalf("v13+ topic ids %x %x", resp.Topics[i].TopicID, resp.Topics[1-i].TopicID)
	}
	p := resp.Topics[i].Partitions[0]
	want(t, p.ErrorCode, "fetch partition")
	if p.HighWatermark != auditRecords || p.LastStableOffset != auditRecords || len(p.RecordBatches) == 0 {
		t.Fatalf("high watermark %d, last stable %d, %d bytes of batches", p.HighWatermark, p.LastStableOffset, len(p.RecordBatches))
	}
	if wantStart := map[bool]int64{true: 0, false: -1}[v >= 5]; p.LogStartOffset != wantStart {
		t.Fatalf("log start offset %d, want %d", p.LogStartOffset, wantStart)
	}
	if (v >= 7) != (resp.SessionID != 0) {
		t.Fatalf("v%d: session id %d", v, resp.SessionID)
	}
	if p.PreferredReadReplica != -1 {
		t.Fatalf("preferred read replica %d, want -1", p.PreferredReadReplica)
	}
}

func listOffsetsReq(v int16, topic string, ts int64, isolation int8) *kmsg.ListOffsetsRequest {
	req := kmsg.NewPtrListOffsetsRequest()
	req.Version, req.IsolationLevel, req.TimeoutMillis = v, isolation, 1000
	rt := latestOffsetTopic(topic)
	rt.Partitions[0].Timestamp = ts
	req.Topics = append(req.Topics, rt)
	return req
}

// auditListOffsets: latest and earliest (v0 as a one-offset list); v4+
// the leader epoch; each
// special timestamp from the version that defines it (-5, latest tiered,
// is -1 without tiered storage), INVALID_REQUEST below it.
func auditListOffsets(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	for _, c := range []struct {
		ts    int64
		since int16
		want  int64
	}{{-1, 0, auditRecords}, {-2, 0, 0}, {-3, 7, auditRecords - 1}, {-4, 8, 0}, {-5, 9, -1}} {
		resp := ask[*kmsg.ListOffsetsResponse](t, rc, listOffsetsReq(v, "audit", c.ts, 1))
		p := resp.Topics[0].Partitions[0]
		if v < c.since {
			if p.ErrorCode != kerr.InvalidRequest.Code {
				t.Fatalf("timestamp %d below v%d: %v, want INVALID_REQUEST", c.ts, c.since, kerr.ErrorForCode(p.ErrorCode))
			}
			continue
		}
		want(t, p.ErrorCode, fmt.Sprint("timestamp ", c.ts))
		if v == 0 {
			if len(p.OldStyleOffsets) != 1 || p.OldStyleOffsets[0] != c.want {
				t.Fatalf("v0 timestamp %d: offsets %v, want [%d]", c.ts, p.OldStyleOffsets, c.want)
			}
			continue
		}
		if p.Offset != c.want {
			t.Fatalf("timestamp %d: offset %d, want %d", c.ts, p.Offset, c.want)
		}
		if wantEpoch := map[bool]int32{true: 0, false: -1}[v >= 4 && c.want >= 0]; p.LeaderEpoch != wantEpoch {
			t.Fatalf("timestamp %d: leader epoch %d, want %d", c.ts, p.LeaderEpoch, wantEpoch)
		}
	}
}

// auditMetadata: the broker and the topic; v1+ the controller and
// internal flag; v2+ the cluster id; v4+ auto-creation only when allowed;
// v7+ leader epochs; v8+ authorized operations; v10+ topic ids, and topics
// asked for by id.
func auditMetadata(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrMetadataRequest()
	req.Version = v
	req.IncludeTopicAuthorizedOperations, req.IncludeClusterAuthorizedOperations = true, true
	rt := kmsg.NewMetadataRequestTopic()
	name := "audit"
	rt.Topic = &name
	req.Topics = append(req.Topics, rt)
	resp := ask[*kmsg.MetadataResponse](t, rc, req)
	if len(resp.Brokers) != 1 || len(resp.Topics) != 1 {
		t.Fatalf("brokers %+v topics %+v", resp.Brokers, resp.Topics)
	}
	mt := resp.Topics[0]
	want(t, mt.ErrorCode, "metadata")
	if len(mt.Partitions) != 3 || mt.IsInternal {
		t.Fatalf("topic %+v", mt)
	}
	if v >= 1 && resp.ControllerID != nodeID {
		t.Fatalf("controller %d", resp.ControllerID)
	}
	if v >= 2 && (resp.ClusterID == nil || *resp.ClusterID == "") {
		t.Fatal("no cluster id")
	}
	if wantEpoch := map[bool]int32{true: 0, false: -1}[v >= 7]; mt.Partitions[0].LeaderEpoch != wantEpoch {
		t.Fatalf("leader epoch %d, want %d", mt.Partitions[0].LeaderEpoch, wantEpoch)
	}
	if wantOps := map[bool]int32{true: allOps(topicOperations), false: authorizedOperationsOmitted}[v >= 8]; mt.AuthorizedOperations != wantOps {
		t.Fatalf("topic authorized operations %x, want %x", mt.AuthorizedOperations, wantOps)
	}
	if v >= 8 && v <= 10 && resp.AuthorizedOperations == authorizedOperationsOmitted {
		t.Fatal("cluster authorized operations omitted though asked for")
	}
	if (v >= 10) != (mt.TopicID == topicID("audit")) {
		t.Fatalf("v%d: topic id %x", v, mt.TopicID)
	}
	if v >= 10 {
		byID := kmsg.NewPtrMetadataRequest()
		byID.Version = v
		rt := kmsg.NewMetadataRequestTopic()
		rt.TopicID = topicID("audit")
		byID.Topics = append(byID.Topics, rt)
		resp := ask[*kmsg.MetadataResponse](t, rc, byID)
		if len(resp.Topics) != 1 || resp.Topics[0].Topic == nil || *resp.Topics[0].Topic != "audit" {
			t.Fatalf("by topic id: %+v", resp.Topics)
		}
	}
	if v >= 4 {
		for _, allow := range []bool{false, true} {
			unknown := fmt.Sprintf("auto-v%d-%v", v, allow)
			auto := kmsg.NewPtrMetadataRequest()
			auto.Version, auto.AllowAutoTopicCreation = v, allow
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = &unknown
			auto.Topics = append(auto.Topics, rt)
			resp := ask[*kmsg.MetadataResponse](t, rc, auto)
			_, err := a.f.b.Topic(unknown)
			if created := err == nil; created != allow || (resp.Topics[0].ErrorCode == 0) != allow {
				t.Fatalf("allow auto-creation %v: created %v, answer %v", allow, created, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
			}
		}
	}
}

func offsetCommitReq(v int16, group string, offset int64) *kmsg.OffsetCommitRequest {
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Version, req.Group, req.Generation, req.RetentionTimeMillis = v, group, -1, -1
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "audit"
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Offset, rp.LeaderEpoch = offset, 0
	meta := "m"
	rp.Metadata = &meta
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	return req
}

// committed is group's committed offset of audit/0 and its leader epoch,
// read with OffsetFetch v8.
func committed(t *testing.T, rc *rawConn, group string) (int64, int32) {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Version = 8
	rg := kmsg.NewOffsetFetchRequestGroup()
	rg.Group = group
	rt := kmsg.NewOffsetFetchRequestGroupTopic()
	rt.Topic, rt.Partitions = "audit", []int32{0}
	rg.Topics = append(rg.Topics, rt)
	req.Groups = append(req.Groups, rg)
	resp := ask[*kmsg.OffsetFetchResponse](t, rc, req)
	want(t, resp.Groups[0].ErrorCode, "offset fetch")
	p := resp.Groups[0].Topics[0].Partitions[0]
	want(t, p.ErrorCode, "offset fetch partition")
	return p.Offset, p.LeaderEpoch
}

// auditOffsetCommit: a standalone commit (generation -1) is kept; v6+
// keeps the leader epoch; v2-v4's retention time is accepted and the
// offset kept until the group is deleted (offsets do not expire).
func auditOffsetCommit(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("oc-v", v)
	req := offsetCommitReq(v, group, 3)
	if v >= 2 && v <= 4 {
		req.RetentionTimeMillis = 1
	}
	resp := ask[*kmsg.OffsetCommitResponse](t, rc, req)
	want(t, resp.Topics[0].Partitions[0].ErrorCode, "commit")
	off, epoch := committed(t, rc, group)
	if off != 3 {
		t.Fatalf("committed offset %d, want 3", off)
	}
	if wantEpoch := map[bool]int32{true: 0, false: -1}[v >= 6]; epoch != wantEpoch {
		t.Fatalf("committed leader epoch %d, want %d", epoch, wantEpoch)
	}
}

// auditOffsetFetch: the committed offset; v2+ all the group's topics for
// null topics; v5+ the leader epoch; v7 require_stable; v8 several groups.
func auditOffsetFetch(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	groups := []string{fmt.Sprint("of-v", v), fmt.Sprint("of2-v", v)}
	for i, g := range groups {
		resp := ask[*kmsg.OffsetCommitResponse](t, rc, offsetCommitReq(8, g, int64(i+1)))
		want(t, resp.Topics[0].Partitions[0].ErrorCode, "commit")
	}
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Version, req.RequireStable = v, true
	if v >= 8 {
		for _, g := range groups {
			rg := kmsg.NewOffsetFetchRequestGroup()
			rg.Group = g
			req.Groups = append(req.Groups, rg)
		}
		resp := ask[*kmsg.OffsetFetchResponse](t, rc, req)
		if len(resp.Groups) != 2 {
			t.Fatalf("groups %+v", resp.Groups)
		}
		for i, g := range resp.Groups {
			want(t, g.ErrorCode, g.Group)
			if len(g.Topics) != 1 || g.Topics[0].Partitions[0].Offset != int64(i+1) || g.Topics[0].Partitions[0].LeaderEpoch != 0 {
				t.Fatalf("group %s: %+v", g.Group, g.Topics)
			}
		}
		return
	}
	req.Group = groups[0]
	if v < 2 {
		rt := kmsg.NewOffsetFetchRequestTopic()
		rt.Topic, rt.Partitions = "audit", []int32{0}
		req.Topics = append(req.Topics, rt)
	}
	resp := ask[*kmsg.OffsetFetchResponse](t, rc, req)
	want(t, resp.ErrorCode, "offset fetch")
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("topics %+v", resp.Topics)
	}
	p := resp.Topics[0].Partitions[0]
	want(t, p.ErrorCode, "partition")
	if p.Offset != 1 || p.Metadata == nil || *p.Metadata != "m" {
		t.Fatalf("offset %d metadata %v", p.Offset, p.Metadata)
	}
	if wantEpoch := map[bool]int32{true: 0, false: -1}[v >= 5]; p.LeaderEpoch != wantEpoch {
		t.Fatalf("leader epoch %d, want %d", p.LeaderEpoch, wantEpoch)
	}
}

// auditFindCoordinator: this node for groups; v1+ for transactional ids;
// v4 several keys at once.
func auditFindCoordinator(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	for _, typ := range []int8{0, 1} {
		if typ == 1 && v < 1 {
			continue
		}
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.Version, req.CoordinatorType = v, typ
		req.CoordinatorKey, req.CoordinatorKeys = "k", []string{"k1", "k2"}
		resp := ask[*kmsg.FindCoordinatorResponse](t, rc, req)
		if v < 4 {
			want(t, resp.ErrorCode, "find coordinator")
			if resp.NodeID != nodeID || resp.Port == 0 {
				t.Fatalf("coordinator %d %s:%d", resp.NodeID, resp.Host, resp.Port)
			}
			continue
		}
		if len(resp.Coordinators) != 2 {
			t.Fatalf("coordinators %+v", resp.Coordinators)
		}
		for i, c := range resp.Coordinators {
			want(t, c.ErrorCode, c.Key)
			if c.Key != req.CoordinatorKeys[i] || c.NodeID != nodeID {
				t.Fatalf("coordinator %+v", c)
			}
		}
	}
}

// classicMember is a classic group member joined over a raw connection.
type classicMember struct {
	rc         *rawConn
	group, id  string
	instance   *string
	generation int32
}

func protocols() []kmsg.JoinGroupRequestProtocol {
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{"audit"}
	p := kmsg.NewJoinGroupRequestProtocol()
	p.Name, p.Metadata = "range", meta.AppendTo(nil)
	return []kmsg.JoinGroupRequestProtocol{p}
}

// joinAt joins group at version v (static when instance is set), taking
// the member id MEMBER_ID_REQUIRED hands out (v4+).
func joinAt(t *testing.T, rc *rawConn, v int16, group, memberID string, instance *string) *kmsg.JoinGroupResponse {
	t.Helper()
	for {
		req := kmsg.NewPtrJoinGroupRequest()
		req.Version, req.Group, req.MemberID, req.InstanceID = v, group, memberID, instance
		req.SessionTimeoutMillis, req.RebalanceTimeoutMillis = 10000, 10000
		req.ProtocolType, req.Protocols = "consumer", protocols()
		reason := "audit"
		req.Reason = &reason
		resp := ask[*kmsg.JoinGroupResponse](t, rc, req)
		if resp.ErrorCode == kerr.MemberIDRequired.Code && v >= 4 && memberID == "" {
			memberID = resp.MemberID
			continue
		}
		return resp
	}
}

// syncAt completes m's generation as its leader with SyncGroup v,
// assigning it assignment.
func syncAt(t *testing.T, m *classicMember, v int16, assignment []byte) *kmsg.SyncGroupResponse {
	t.Helper()
	req := kmsg.NewPtrSyncGroupRequest()
	req.Version, req.Group, req.MemberID, req.Generation, req.InstanceID = v, m.group, m.id, m.generation, m.instance
	pt, proto := "consumer", "range"
	req.ProtocolType, req.Protocol = &pt, &proto
	a := kmsg.NewSyncGroupRequestGroupAssignment()
	a.MemberID, a.MemberAssignment = m.id, assignment
	req.GroupAssignment = append(req.GroupAssignment, a)
	return ask[*kmsg.SyncGroupResponse](t, m.rc, req)
}

// stableMember is a static member of a new group with one member, Stable
// (JoinGroup v5 and SyncGroup v5).
func stableMember(t *testing.T, addr, group string) *classicMember {
	t.Helper()
	instance := group + "-instance"
	m := &classicMember{rc: dialRaw(t, addr), group: group, instance: &instance}
	resp := joinAt(t, m.rc, 5, group, "", m.instance)
	want(t, resp.ErrorCode, "join")
	m.id, m.generation = resp.MemberID, resp.Generation
	want(t, syncAt(t, m, 5, []byte("assignment")).ErrorCode, "sync")
	return m
}

// auditJoinGroup: one member forms generation 1 and leads it; v4+ after
// MEMBER_ID_REQUIRED; v5+ static members keep their instance id; v7+ the
// protocol type is named; v9 a static leader rejoining the Stable group
// gets the members with SkipAssignment.
func auditJoinGroup(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("join-v", v)
	var instance *string
	if v >= 5 {
		id := group + "-instance"
		instance = &id
	}
	resp := joinAt(t, rc, v, group, "", instance)
	want(t, resp.ErrorCode, "join")
	if resp.Generation < 1 || resp.LeaderID != resp.MemberID || len(resp.Members) != 1 || resp.Protocol == nil || *resp.Protocol != "range" {
		t.Fatalf("join: %+v", resp)
	}
	if v >= 5 && (resp.Members[0].InstanceID == nil || *resp.Members[0].InstanceID != *instance) {
		t.Fatalf("member instance id %v", resp.Members[0].InstanceID)
	}
	if (v >= 7) != (resp.ProtocolType != nil && *resp.ProtocolType == "consumer") {
		t.Fatalf("v%d: protocol type %v", v, resp.ProtocolType)
	}
	if v < 5 {
		return
	}
	m := &classicMember{rc: rc, group: group, id: resp.MemberID, instance: instance, generation: resp.Generation}
	want(t, syncAt(t, m, 5, []byte("a")).ErrorCode, "sync")
	again := joinAt(t, dialRaw(t, a.f.addr), v, group, "", instance)
	want(t, again.ErrorCode, "static rejoin")
	if again.Generation != m.generation || again.LeaderID != again.MemberID || len(again.Members) != 1 {
		t.Fatalf("static leader rejoin: %+v", again)
	}
	if again.SkipAssignment != (v >= 9) {
		t.Fatalf("v%d: skip assignment %v", v, again.SkipAssignment)
	}
}

// auditSyncGroup: the leader's assignment comes back to it; v3+ as a
// static member; v5+ with the protocol type and name.
func auditSyncGroup(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("sync-v", v)
	var instance *string
	if v >= 3 {
		id := group + "-instance"
		instance = &id
	}
	resp := joinAt(t, rc, 5, group, "", instance)
	want(t, resp.ErrorCode, "join")
	m := &classicMember{rc: rc, group: group, id: resp.MemberID, instance: instance, generation: resp.Generation}
	sync := syncAt(t, m, v, []byte("assigned"))
	want(t, sync.ErrorCode, "sync")
	if string(sync.MemberAssignment) != "assigned" {
		t.Fatalf("assignment %q", sync.MemberAssignment)
	}
	if (v >= 5) != (sync.Protocol != nil && *sync.Protocol == "range" && sync.ProtocolType != nil && *sync.ProtocolType == "consumer") {
		t.Fatalf("v%d: protocol %v type %v", v, sync.Protocol, sync.ProtocolType)
	}
}

// auditHeartbeat: a member of the current generation is answered 0, an
// old generation ILLEGAL_GENERATION; v3+ as a static member.
func auditHeartbeat(t *testing.T, a *audit, v int16) {
	m := stableMember(t, a.f.addr, fmt.Sprint("hb-v", v))
	for _, gen := range []int32{m.generation, m.generation + 1} {
		req := kmsg.NewPtrHeartbeatRequest()
		req.Version, req.Group, req.MemberID, req.Generation = v, m.group, m.id, gen
		if v >= 3 {
			req.InstanceID = m.instance
		}
		resp := ask[*kmsg.HeartbeatResponse](t, m.rc, req)
		if wantCode := map[bool]int16{true: 0, false: kerr.IllegalGeneration.Code}[gen == m.generation]; resp.ErrorCode != wantCode {
			t.Fatalf("generation %d: %v", gen, kerr.ErrorForCode(resp.ErrorCode))
		}
	}
}

// describeGroup is DescribeGroups v5 of group.
func describeGroup(t *testing.T, rc *rawConn, group string) kmsg.DescribeGroupsResponseGroup {
	t.Helper()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Version, req.Groups = 5, []string{group}
	return ask[*kmsg.DescribeGroupsResponse](t, rc, req).Groups[0]
}

// auditLeaveGroup: the member leaves and the group has none (Dead, as
// the coordinator forgets a group with no members and no offsets); v3+ by
// member (and instance) in a batch, each answered.
func auditLeaveGroup(t *testing.T, a *audit, v int16) {
	m := stableMember(t, a.f.addr, fmt.Sprint("leave-v", v))
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Version, req.Group, req.MemberID = v, m.group, m.id
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID, lm.InstanceID = m.id, m.instance
	reason := "audit"
	lm.Reason = &reason
	req.Members = append(req.Members, lm)
	resp := ask[*kmsg.LeaveGroupResponse](t, m.rc, req)
	want(t, resp.ErrorCode, "leave")
	if v >= 3 && (len(resp.Members) != 1 || resp.Members[0].MemberID != m.id || resp.Members[0].ErrorCode != 0) {
		t.Fatalf("members %+v", resp.Members)
	}
	if g := describeGroup(t, m.rc, m.group); g.State != "Dead" || len(g.Members) != 0 {
		t.Fatalf("after leaving: %s with %d members", g.State, len(g.Members))
	}
}

// auditDescribeGroups: a Stable group with its member; v3+ the authorized
// operations when asked; v4+ the member's instance id.
func auditDescribeGroups(t *testing.T, a *audit, v int16) {
	m := stableMember(t, a.f.addr, fmt.Sprint("describe-v", v))
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Version, req.Groups, req.IncludeAuthorizedOperations = v, []string{m.group}, true
	resp := ask[*kmsg.DescribeGroupsResponse](t, m.rc, req)
	g := resp.Groups[0]
	want(t, g.ErrorCode, "describe")
	if g.State != "Stable" || g.ProtocolType != "consumer" || g.Protocol != "range" || len(g.Members) != 1 || string(g.Members[0].MemberAssignment) != "assignment" {
		t.Fatalf("group %+v", g)
	}
	if wantOps := map[bool]int32{true: allOps(groupOperations), false: authorizedOperationsOmitted}[v >= 3]; g.AuthorizedOperations != wantOps {
		t.Fatalf("authorized operations %x, want %x", g.AuthorizedOperations, wantOps)
	}
	if (v >= 4) != (g.Members[0].InstanceID != nil && *g.Members[0].InstanceID == *m.instance) {
		t.Fatalf("v%d: instance id %v", v, g.Members[0].InstanceID)
	}
}

// auditListGroups: the group is listed; v4+ with its state, and filtered
// by state; v5+ with its type, and filtered by type.
func auditListGroups(t *testing.T, a *audit, v int16) {
	m := stableMember(t, a.f.addr, fmt.Sprint("list-v", v))
	list := func(states, types []string) []kmsg.ListGroupsResponseGroup {
		req := kmsg.NewPtrListGroupsRequest()
		req.Version, req.StatesFilter, req.TypesFilter = v, states, types
		resp := ask[*kmsg.ListGroupsResponse](t, m.rc, req)
		want(t, resp.ErrorCode, "list groups")
		return slices.DeleteFunc(resp.Groups, func(g kmsg.ListGroupsResponseGroup) bool { return g.Group != m.group })
	}
	gs := list(nil, nil)
	if len(gs) != 1 || gs[0].ProtocolType != "consumer" {
		t.Fatalf("listed %+v", gs)
	}
	if v >= 4 && (gs[0].GroupState != "Stable" || len(list([]string{"Stable"}, nil)) != 1 || len(list([]string{"Empty"}, nil)) != 0) {
		t.Fatalf("state %q or the state filter does not hold", gs[0].GroupState)
	}
	if v >= 5 && (gs[0].GroupType != "classic" || len(list(nil, []string{"classic"})) != 1 || len(list(nil, []string{"consumer"})) != 0) {
		t.Fatalf("type %q or the type filter does not hold", gs[0].GroupType)
	}
}

// auditApiVersions: exactly the advertised ranges; v3 (flexible) with the
// client's software name and version.
func auditApiVersions(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrApiVersionsRequest()
	req.Version, req.ClientSoftwareName, req.ClientSoftwareVersion = v, "audit", "1.0"
	resp := ask[*kmsg.ApiVersionsResponse](t, rc, req)
	want(t, resp.ErrorCode, "api versions")
	if len(resp.ApiKeys) != len(supportedVersions) {
		t.Fatalf("%d keys, want %d", len(resp.ApiKeys), len(supportedVersions))
	}
	for _, k := range resp.ApiKeys {
		if r := supportedVersions[k.ApiKey]; k.MinVersion != r.min || k.MaxVersion != r.max {
			t.Fatalf("key %d: %d-%d, want %d-%d", k.ApiKey, k.MinVersion, k.MaxVersion, r.min, r.max)
		}
	}
}

// auditCreateTopics: the topic is made; v1+ validate-only makes nothing;
// v4+ -1 takes the defaults; v5+ the answer has the partitions,
// replication factor and configs; v7+ the topic id.
func auditCreateTopics(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	create := func(name string, validate bool) kmsg.CreateTopicsResponseTopic {
		req := kmsg.NewPtrCreateTopicsRequest()
		req.Version, req.TimeoutMillis, req.ValidateOnly = v, 5000, validate
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 2, 1
		if v >= 4 {
			rt.NumPartitions, rt.ReplicationFactor = -1, -1
		}
		req.Topics = append(req.Topics, rt)
		return ask[*kmsg.CreateTopicsResponse](t, rc, req).Topics[0]
	}
	name := fmt.Sprint("created-v", v)
	ct := create(name, false)
	want(t, ct.ErrorCode, "create")
	ti, err := a.f.b.Topic(name)
	if err != nil {
		t.Fatal(err)
	}
	if v >= 5 && (ct.NumPartitions != int32(len(ti.Partitions)) || ct.ReplicationFactor != 1 || len(ct.Configs) == 0) {
		t.Fatalf("v5+ answer %+v for %d partitions", ct, len(ti.Partitions))
	}
	if (v >= 7) != (ct.TopicID == topicID(name)) {
		t.Fatalf("v%d: topic id %x", v, ct.TopicID)
	}
	if v >= 1 {
		validated := fmt.Sprint("validated-v", v)
		want(t, create(validated, true).ErrorCode, "validate only")
		if _, err := a.f.b.Topic(validated); err == nil {
			t.Fatal("validate-only created the topic")
		}
	}
}

// auditDeleteTopics: the topic is gone; v6+ named by topic id.
func auditDeleteTopics(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	name := fmt.Sprint("deleted-v", v)
	a.f.createTopic(t, name, 1)
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.Version, req.TimeoutMillis, req.TopicNames = v, 5000, []string{name}
	dt := kmsg.NewDeleteTopicsRequestTopic()
	dt.TopicID = topicID(name)
	req.Topics = append(req.Topics, dt)
	resp := ask[*kmsg.DeleteTopicsResponse](t, rc, req)
	want(t, resp.Topics[0].ErrorCode, "delete")
	if _, err := a.f.b.Topic(name); err == nil {
		t.Fatal("topic still there")
	}
	if v >= 6 && (resp.Topics[0].Topic == nil || *resp.Topics[0].Topic != name) {
		t.Fatalf("v6+ answer names %v", resp.Topics[0].Topic)
	}
}

// auditDeleteRecords: the log start moves to the offset asked.
func auditDeleteRecords(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	name := fmt.Sprint("records-v", v)
	a.f.createTopic(t, name, 1)
	for range 3 {
		want(t, ask[*kmsg.ProduceResponse](t, rc, produceReq(9, name, relayBatch("x"))).Topics[0].Partitions[0].ErrorCode, "produce")
	}
	req := kmsg.NewPtrDeleteRecordsRequest()
	req.Version, req.TimeoutMillis = v, 5000
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = name
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Offset = 2
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	p := ask[*kmsg.DeleteRecordsResponse](t, rc, req).Topics[0].Partitions[0]
	want(t, p.ErrorCode, "delete records")
	earliest := ask[*kmsg.ListOffsetsResponse](t, rc, listOffsetsReq(5, name, -2, 0)).Topics[0].Partitions[0].Offset
	if p.LowWatermark != 2 || earliest != 2 {
		t.Fatalf("low watermark %d, earliest %d, want 2", p.LowWatermark, earliest)
	}
}

func initProducerID(t *testing.T, rc *rawConn, v int16, txnID *string, id int64, epoch int16) *kmsg.InitProducerIDResponse {
	t.Helper()
	req := kmsg.NewPtrInitProducerIDRequest()
	req.Version, req.TransactionalID, req.TransactionTimeoutMillis = v, txnID, 60000
	req.ProducerID, req.ProducerEpoch = id, epoch
	return ask[*kmsg.InitProducerIDResponse](t, rc, req)
}

// auditInitProducerID: an idempotent producer id; a transactional one;
// v3+ the same id with its epoch bumped when the producer names its
// current id and epoch (KIP-360), and a stale epoch refused (v4+
// PRODUCER_FENCED, INVALID_PRODUCER_EPOCH before).
func auditInitProducerID(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	idem := initProducerID(t, rc, v, nil, -1, -1)
	want(t, idem.ErrorCode, "idempotent")
	txnID := fmt.Sprint("init-v", v)
	first := initProducerID(t, rc, v, &txnID, -1, -1)
	want(t, first.ErrorCode, "transactional")
	if idem.ProducerID < 0 || first.ProducerID < 0 || first.ProducerID == idem.ProducerID {
		t.Fatalf("producer ids %d and %d", idem.ProducerID, first.ProducerID)
	}
	if v < 3 {
		return
	}
	bumped := initProducerID(t, rc, v, &txnID, first.ProducerID, first.ProducerEpoch)
	want(t, bumped.ErrorCode, "bump")
	if bumped.ProducerID != first.ProducerID || bumped.ProducerEpoch != first.ProducerEpoch+1 {
		t.Fatalf("bumped to %d/%d from %d/%d", bumped.ProducerID, bumped.ProducerEpoch, first.ProducerID, first.ProducerEpoch)
	}
	stale := initProducerID(t, rc, v, &txnID, first.ProducerID, first.ProducerEpoch)
	if wantCode := map[bool]int16{true: kerr.ProducerFenced.Code, false: kerr.InvalidProducerEpoch.Code}[v >= 4]; stale.ErrorCode != wantCode {
		t.Fatalf("stale epoch: %v, want %v", kerr.ErrorForCode(stale.ErrorCode), kerr.ErrorForCode(wantCode))
	}
}

// auditTxn runs a transaction that adds a partition and a group's offsets
// and commits, with the API under test at version v (the others at v3);
// after the commit the partition has its marker and the group its
// offset, read as stable. TxnOffsetCommit v2+ keeps the leader epoch.
func auditTxn(key kmsg.Key) func(t *testing.T, a *audit, v int16) {
	return func(t *testing.T, a *audit, v int16) {
		rc := dialRaw(t, a.f.addr)
		txnID, group := fmt.Sprintf("txn-%s-v%d", key.Name(), v), fmt.Sprintf("txg-%s-v%d", key.Name(), v)
		topic := txnID
		a.f.createTopic(t, topic, 1)
		pid := initProducerID(t, rc, 4, &txnID, -1, -1)
		want(t, pid.ErrorCode, "init producer id")

		add := kmsg.NewPtrAddPartitionsToTxnRequest()
		add.Version, add.TransactionalID, add.ProducerID, add.ProducerEpoch = atVersion(key, kmsg.AddPartitionsToTxn, v), txnID, pid.ProducerID, pid.ProducerEpoch
		addTopic := kmsg.NewAddPartitionsToTxnRequestTopic()
		addTopic.Topic, addTopic.Partitions = topic, []int32{0}
		add.Topics = append(add.Topics, addTopic)
		want(t, ask[*kmsg.AddPartitionsToTxnResponse](t, rc, add).Topics[0].Partitions[0].ErrorCode, "add partitions")

		addOff := kmsg.NewPtrAddOffsetsToTxnRequest()
		addOff.Version, addOff.TransactionalID, addOff.ProducerID, addOff.ProducerEpoch, addOff.Group = atVersion(key, kmsg.AddOffsetsToTxn, v), txnID, pid.ProducerID, pid.ProducerEpoch, group
		want(t, ask[*kmsg.AddOffsetsToTxnResponse](t, rc, addOff).ErrorCode, "add offsets")

		commit := kmsg.NewPtrTxnOffsetCommitRequest()
		commit.Version, commit.TransactionalID, commit.Group = atVersion(key, kmsg.TxnOffsetCommit, v), txnID, group
		commit.ProducerID, commit.ProducerEpoch, commit.Generation = pid.ProducerID, pid.ProducerEpoch, -1
		ct := kmsg.NewTxnOffsetCommitRequestTopic()
		ct.Topic = "audit"
		cp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		cp.Offset, cp.LeaderEpoch = 4, 0
		ct.Partitions = append(ct.Partitions, cp)
		commit.Topics = append(commit.Topics, ct)
		want(t, ask[*kmsg.TxnOffsetCommitResponse](t, rc, commit).Topics[0].Partitions[0].ErrorCode, "txn offset commit")

		end := kmsg.NewPtrEndTxnRequest()
		end.Version, end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = atVersion(key, kmsg.EndTxn, v), txnID, pid.ProducerID, pid.ProducerEpoch, true
		want(t, ask[*kmsg.EndTxnResponse](t, rc, end).ErrorCode, "end txn")

		deadline := time.Now().Add(10 * time.Second)
		for {
			lo := ask[*kmsg.ListOffsetsResponse](t, rc, listOffsetsReq(5, topic, -1, 1)).Topics[0].Partitions[0]
			req := kmsg.NewPtrOffsetFetchRequest()
			req.Version, req.Group, req.RequireStable = 7, group, true
			of := ask[*kmsg.OffsetFetchResponse](t, rc, req)
			if lo.Offset == 1 && of.ErrorCode == 0 && len(of.Topics) == 1 && of.Topics[0].Partitions[0].Offset == 4 {
				wantEpoch := map[bool]int32{true: 0, false: -1}[key != kmsg.TxnOffsetCommit || v >= 2]
				if got := of.Topics[0].Partitions[0].LeaderEpoch; got != wantEpoch {
					t.Fatalf("committed leader epoch %d, want %d", got, wantEpoch)
				}
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after commit: last stable offset %d, offsets %v %+v", lo.Offset, kerr.ErrorForCode(of.ErrorCode), of.Topics)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// atVersion is v for the API under test and 3 for the others.
func atVersion(under, k kmsg.Key, v int16) int16 {
	if k == under {
		return v
	}
	return 3
}

// auditACLs creates an ACL (v1+ a prefixed one), describes it and deletes
// it, with the API under test at version v (the others at v1, or v0 when
// v is 0, so that the pattern types agree).
func auditACLs(key kmsg.Key) func(t *testing.T, a *audit, v int16) {
	return func(t *testing.T, a *audit, v int16) {
		other := int16(1)
		if v == 0 {
			other = 0
		}
		rc := dialRaw(t, a.acl.addr)
		name := fmt.Sprintf("acl-%s-v%d", key.Name(), v)
		pattern := kmsg.ACLResourcePatternTypeLiteral
		if v >= 1 {
			pattern = kmsg.ACLResourcePatternTypePrefixed
		}
		create := kmsg.NewPtrCreateACLsRequest()
		create.Version = atVersionOr(key, kmsg.CreateACLs, v, other)
		c := kmsg.NewCreateACLsRequestCreation()
		c.ResourceType, c.ResourceName, c.ResourcePatternType = kmsg.ACLResourceTypeTopic, name, pattern
		c.Principal, c.Host, c.Operation, c.PermissionType = "User:alice", "*", kmsg.ACLOperationWrite, kmsg.ACLPermissionTypeAllow
		create.Creations = append(create.Creations, c)
		want(t, ask[*kmsg.CreateACLsResponse](t, rc, create).Results[0].ErrorCode, "create acl")

		describe := kmsg.NewPtrDescribeACLsRequest()
		describe.Version = atVersionOr(key, kmsg.DescribeACLs, v, other)
		describe.ResourceType, describe.ResourceName, describe.ResourcePatternType = kmsg.ACLResourceTypeTopic, &name, kmsg.ACLResourcePatternTypeAny
		if describe.Version == 0 {
			describe.ResourcePatternType = kmsg.ACLResourcePatternTypeLiteral
		}
		describe.Operation, describe.PermissionType = kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
		dr := ask[*kmsg.DescribeACLsResponse](t, rc, describe)
		want(t, dr.ErrorCode, "describe acls")
		if len(dr.Resources) != 1 || len(dr.Resources[0].ACLs) != 1 || dr.Resources[0].ACLs[0].Principal != "User:alice" {
			t.Fatalf("described %+v", dr.Resources)
		}
		if describe.Version >= 1 && dr.Resources[0].ResourcePatternType != pattern {
			t.Fatalf("pattern type %v, want %v", dr.Resources[0].ResourcePatternType, pattern)
		}

		del := kmsg.NewPtrDeleteACLsRequest()
		del.Version = atVersionOr(key, kmsg.DeleteACLs, v, other)
		f := kmsg.NewDeleteACLsRequestFilter()
		f.ResourceType, f.ResourceName, f.ResourcePatternType = kmsg.ACLResourceTypeTopic, &name, pattern
		f.Operation, f.PermissionType = kmsg.ACLOperationAny, kmsg.ACLPermissionTypeAny
		del.Filters = append(del.Filters, f)
		res := ask[*kmsg.DeleteACLsResponse](t, rc, del).Results[0]
		want(t, res.ErrorCode, "delete acls")
		if len(res.MatchingACLs) != 1 || res.MatchingACLs[0].ResourceName != name {
			t.Fatalf("deleted %+v", res.MatchingACLs)
		}
		if del.Version >= 1 && res.MatchingACLs[0].ResourcePatternType != pattern {
			t.Fatalf("deleted pattern type %v", res.MatchingACLs[0].ResourcePatternType)
		}
		if left := ask[*kmsg.DescribeACLsResponse](t, rc, describe); len(left.Resources) != 0 {
			t.Fatalf("left after delete: %+v", left.Resources)
		}
	}
}

func atVersionOr(under, k kmsg.Key, v, other int16) int16 {
	if k == under {
		return v
	}
	return other
}

// auditDescribeConfigs: the topic's configs; v0 marks defaults; v1+
// synonyms when asked; v3+ documentation when asked.
func auditDescribeConfigs(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.Version, req.IncludeSynonyms, req.IncludeDocumentation = v, true, true
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, "audit"
	req.Resources = append(req.Resources, rr)
	r := ask[*kmsg.DescribeConfigsResponse](t, rc, req).Resources[0]
	want(t, r.ErrorCode, "describe configs")
	if len(r.Configs) != len(broker.TopicConfigNames) {
		t.Fatalf("%d configs, want %d", len(r.Configs), len(broker.TopicConfigNames))
	}
	for _, c := range r.Configs {
		if c.Value == nil || (v == 0 && !c.IsDefault) {
			t.Fatalf("config %s: value %v default %v", c.Name, c.Value, c.IsDefault)
		}
		if (v >= 1) != (len(c.ConfigSynonyms) == 1) {
			t.Fatalf("v%d: config %s synonyms %+v", v, c.Name, c.ConfigSynonyms)
		}
		if (v >= 3) != (c.Documentation != nil && *c.Documentation != "") {
			t.Fatalf("v%d: config %s documentation %v", v, c.Name, c.Documentation)
		}
	}
}

// describedConfig is the value of config name of topic, as DescribeConfigs v4
// reports it.
func describedConfig(t *testing.T, rc *rawConn, topic, name string) string {
	t.Helper()
	req := kmsg.NewPtrDescribeConfigsRequest()
	req.Version = 4
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName, rr.ConfigNames = kmsg.ConfigResourceTypeTopic, topic, []string{name}
	req.Resources = append(req.Resources, rr)
	r := ask[*kmsg.DescribeConfigsResponse](t, rc, req).Resources[0]
	want(t, r.ErrorCode, "describe configs")
	return *r.Configs[0].Value
}

// auditAlterConfigs: a topic's retention is set, and validate-only sets
// nothing.
func auditAlterConfigs(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	topic := fmt.Sprint("alter-v", v)
	a.f.createTopic(t, topic, 1)
	for _, c := range []struct {
		value    string
		validate bool
	}{{"123456", false}, {"654321", true}} {
		req := kmsg.NewPtrAlterConfigsRequest()
		req.Version, req.ValidateOnly = v, c.validate
		rr := kmsg.NewAlterConfigsRequestResource()
		rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
		cfg := kmsg.NewAlterConfigsRequestResourceConfig()
		cfg.Name, cfg.Value = "retention.ms", &c.value
		rr.Configs = append(rr.Configs, cfg)
		req.Resources = append(req.Resources, rr)
		want(t, ask[*kmsg.AlterConfigsResponse](t, rc, req).Resources[0].ErrorCode, "alter configs")
	}
	if got := describedConfig(t, rc, topic, "retention.ms"); got != "123456" {
		t.Fatalf("retention.ms %s, want 123456", got)
	}
}

// auditIncrementalAlterConfigs: SET and APPEND apply.
func auditIncrementalAlterConfigs(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	topic := fmt.Sprint("incremental-v", v)
	a.f.createTopic(t, topic, 1)
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	req.Version = v
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	for _, c := range []struct {
		name, value string
		op          kmsg.IncrementalAlterConfigOp
	}{{"retention.ms", "7777", kmsg.IncrementalAlterConfigOpSet}, {"cleanup.policy", "compact", kmsg.IncrementalAlterConfigOpAppend}} {
		cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		value := c.value
		cfg.Name, cfg.Op, cfg.Value = c.name, c.op, &value
		rr.Configs = append(rr.Configs, cfg)
	}
	req.Resources = append(req.Resources, rr)
	want(t, ask[*kmsg.IncrementalAlterConfigsResponse](t, rc, req).Resources[0].ErrorCode, "incremental alter configs")
	if got := describedConfig(t, rc, topic, "retention.ms"); got != "7777" {
		t.Fatalf("retention.ms %s", got)
	}
	if got := describedConfig(t, rc, topic, "cleanup.policy"); got != "delete,compact" {
		t.Fatalf("cleanup.policy %s", got)
	}
}

// auditDescribeLogDirs: one directory holding the topic's partitions;
// v3+ its error code; v4+ its total and usable bytes.
func auditDescribeLogDirs(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrDescribeLogDirsRequest()
	req.Version = v
	resp := ask[*kmsg.DescribeLogDirsResponse](t, rc, req)
	want(t, resp.ErrorCode, "describe log dirs")
	if len(resp.Dirs) != 1 {
		t.Fatalf("dirs %+v", resp.Dirs)
	}
	d := resp.Dirs[0]
	want(t, d.ErrorCode, "dir")
	i := slices.IndexFunc(d.Topics, func(dt kmsg.DescribeLogDirsResponseDirTopic) bool { return dt.Topic == "audit" })
	if i < 0 || len(d.Topics[i].Partitions) != 3 {
		t.Fatalf("audit not described: %+v", d.Topics)
	}
	for _, p := range d.Topics[i].Partitions {
		if p.Partition == 0 && p.Size <= 0 {
			t.Fatalf("partition 0 size %d", p.Size)
		}
	}
	if (v >= 4) != (d.TotalBytes > 0 && d.UsableBytes > 0) {
		t.Fatalf("v%d: total %d usable %d bytes", v, d.TotalBytes, d.UsableBytes)
	}
}

// auditCreatePartitions: an empty topic grows; a lower count is refused.
func auditCreatePartitions(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	topic := fmt.Sprint("grow-v", v)
	a.f.createTopic(t, topic, 1)
	for _, c := range []struct {
		count int32
		code  int16
	}{{3, 0}, {2, kerr.InvalidPartitions.Code}} {
		req := kmsg.NewPtrCreatePartitionsRequest()
		req.Version, req.TimeoutMillis = v, 5000
		rt := kmsg.NewCreatePartitionsRequestTopic()
		rt.Topic, rt.Count = topic, c.count
		req.Topics = append(req.Topics, rt)
		if got := ask[*kmsg.CreatePartitionsResponse](t, rc, req).Topics[0].ErrorCode; got != c.code {
			t.Fatalf("to %d partitions: %v", c.count, kerr.ErrorForCode(got))
		}
	}
	if ti, err := a.f.b.Topic(topic); err != nil || len(ti.Partitions) != 3 {
		t.Fatalf("%d partitions (%v)", len(ti.Partitions), err)
	}
}

// auditDeleteGroups: a group with only offsets is deleted, its offsets
// with it.
func auditDeleteGroups(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("deleted-group-v", v)
	want(t, ask[*kmsg.OffsetCommitResponse](t, rc, offsetCommitReq(8, group, 2)).Topics[0].Partitions[0].ErrorCode, "commit")
	req := kmsg.NewPtrDeleteGroupsRequest()
	req.Version, req.Groups = v, []string{group}
	want(t, ask[*kmsg.DeleteGroupsResponse](t, rc, req).Groups[0].ErrorCode, "delete groups")
	if off, _ := committed(t, rc, group); off != -1 {
		t.Fatalf("offset %d after delete", off)
	}
}

// auditOffsetDelete: the topic's offset is removed from the group.
func auditOffsetDelete(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("offset-delete-v", v)
	want(t, ask[*kmsg.OffsetCommitResponse](t, rc, offsetCommitReq(8, group, 2)).Topics[0].Partitions[0].ErrorCode, "commit")
	req := kmsg.NewPtrOffsetDeleteRequest()
	req.Version, req.Group = v, group
	rt := kmsg.NewOffsetDeleteRequestTopic()
	rt.Topic = "audit"
	rp := kmsg.NewOffsetDeleteRequestTopicPartition()
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := ask[*kmsg.OffsetDeleteResponse](t, rc, req)
	want(t, resp.ErrorCode, "offset delete")
	want(t, resp.Topics[0].Partitions[0].ErrorCode, "offset delete partition")
	if off, _ := committed(t, rc, group); off != -1 {
		t.Fatalf("offset %d after delete", off)
	}
}

// auditDescribeCluster: the one broker; the authorized operations when
// asked; v1+ the broker endpoint type, controller endpoints refused as
// UNSUPPORTED_ENDPOINT_TYPE; v2+ fenced brokers included (there are none).
func auditDescribeCluster(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	req := kmsg.NewPtrDescribeClusterRequest()
	req.Version, req.IncludeClusterAuthorizedOperations, req.EndpointType, req.IncludeFencedBrokers = v, true, 1, true
	resp := ask[*kmsg.DescribeClusterResponse](t, rc, req)
	want(t, resp.ErrorCode, "describe cluster")
	if len(resp.Brokers) != 1 || resp.Brokers[0].NodeID != nodeID || resp.Brokers[0].IsFenced || resp.ClusterID == "" {
		t.Fatalf("cluster %+v", resp)
	}
	if resp.ClusterAuthorizedOperations == authorizedOperationsOmitted || resp.ClusterAuthorizedOperations == 0 {
		t.Fatalf("cluster authorized operations %x", resp.ClusterAuthorizedOperations)
	}
	if v >= 1 {
		req.EndpointType = 2
		if got := ask[*kmsg.DescribeClusterResponse](t, rc, req).ErrorCode; got != kerr.UnsupportedEndpointType.Code {
			t.Fatalf("controller endpoints: %v", kerr.ErrorForCode(got))
		}
	}
}

// openTxn starts a transaction on audit/1 and returns its producer id.
func openTxn(t *testing.T, rc *rawConn, txnID string) int64 {
	t.Helper()
	pid := initProducerID(t, rc, 4, &txnID, -1, -1)
	want(t, pid.ErrorCode, "init producer id")
	add := kmsg.NewPtrAddPartitionsToTxnRequest()
	add.Version, add.TransactionalID, add.ProducerID, add.ProducerEpoch = 3, txnID, pid.ProducerID, pid.ProducerEpoch
	at := kmsg.NewAddPartitionsToTxnRequestTopic()
	at.Topic, at.Partitions = "audit", []int32{1}
	add.Topics = append(add.Topics, at)
	want(t, ask[*kmsg.AddPartitionsToTxnResponse](t, rc, add).Topics[0].Partitions[0].ErrorCode, "add partitions")
	return pid.ProducerID
}

// auditDescribeTransactions: an open transaction with its producer id and
// partition.
func auditDescribeTransactions(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	txnID := fmt.Sprint("describe-txn-v", v)
	pid := openTxn(t, rc, txnID)
	req := kmsg.NewPtrDescribeTransactionsRequest()
	req.Version, req.TransactionalIDs = v, []string{txnID}
	st := ask[*kmsg.DescribeTransactionsResponse](t, rc, req).TransactionStates[0]
	want(t, st.ErrorCode, "describe transactions")
	if st.State != "Ongoing" || st.ProducerID != pid || len(st.Topics) != 1 || st.Topics[0].Topic != "audit" {
		t.Fatalf("transaction %+v", st)
	}
}

// auditListTransactions: an open transaction is listed; v1+ not when it
// is younger than the duration filter.
func auditListTransactions(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	txnID := fmt.Sprint("list-txn-v", v)
	openTxn(t, rc, txnID)
	listed := func(duration int64) bool {
		req := kmsg.NewPtrListTransactionsRequest()
		req.Version, req.DurationFilterMillis = v, duration
		resp := ask[*kmsg.ListTransactionsResponse](t, rc, req)
		want(t, resp.ErrorCode, "list transactions")
		return slices.ContainsFunc(resp.TransactionStates, func(s kmsg.ListTransactionsResponseTransactionState) bool {
			return s.TransactionalID == txnID && s.TransactionState == "Ongoing"
		})
	}
	if !listed(-1) {
		t.Fatal("open transaction not listed")
	}
	if v >= 1 && listed(time.Hour.Milliseconds()) {
		t.Fatal("a transaction younger than the duration filter is listed")
	}
}

// consumerMember joins a KIP-848 group at ConsumerGroupHeartbeat v (v1+
// with a client-made member id and a regex) and heartbeats until the
// audit topic's partitions are assigned.
func consumerMember(t *testing.T, rc *rawConn, v int16, group string) *kmsg.ConsumerGroupHeartbeatResponse {
	t.Helper()
	memberID, epoch := "", int32(0)
	if v >= 1 {
		memberID = group + "-member"
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Version, req.Group, req.MemberID, req.MemberEpoch, req.RebalanceTimeoutMillis = v, group, memberID, epoch, 10000
		if epoch == 0 {
			req.SubscribedTopicNames = []string{"audit"}
			if v >= 1 {
				re := "^aud.t$"
				req.SubscribedTopicNames, req.SubscribedTopicRegex = nil, &re
			}
			req.Topics = []kmsg.ConsumerGroupHeartbeatRequestTopic{}
		}
		resp := ask[*kmsg.ConsumerGroupHeartbeatResponse](t, rc, req)
		want(t, resp.ErrorCode, "consumer group heartbeat")
		memberID, epoch = *resp.MemberID, resp.MemberEpoch
		if a := resp.Assignment; a != nil && len(a.Topics) == 1 && len(a.Topics[0].Partitions) == 3 {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("no assignment of audit's 3 partitions: %+v", resp.Assignment)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// auditConsumerGroupHeartbeat: a member is assigned the topic it
// subscribes to by name; v1+ by a regex the broker resolves.
func auditConsumerGroupHeartbeat(t *testing.T, a *audit, v int16) {
	resp := consumerMember(t, dialRaw(t, a.f.addr), v, fmt.Sprint("cgh-v", v))
	if resp.Assignment.Topics[0].TopicID != topicID("audit") || resp.MemberEpoch < 1 {
		t.Fatalf("assignment %+v at epoch %d", resp.Assignment, resp.MemberEpoch)
	}
}

// auditConsumerGroupDescribe: the group and its member with the
// assignment; v1+ the member's type (consumer).
func auditConsumerGroupDescribe(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.f.addr)
	group := fmt.Sprint("cgd-v", v)
	hb := consumerMember(t, rc, 1, group)
	req := kmsg.NewPtrConsumerGroupDescribeRequest()
	req.Version, req.Groups = v, []string{group}
	g := ask[*kmsg.ConsumerGroupDescribeResponse](t, rc, req).Groups[0]
	want(t, g.ErrorCode, "consumer group describe")
	if len(g.Members) != 1 || g.Members[0].MemberID != *hb.MemberID || len(g.Members[0].Assignment.TopicPartitions) != 1 {
		t.Fatalf("group %+v", g)
	}
	if wantType := map[bool]int8{true: 1, false: -1}[v >= 1]; g.Members[0].MemberType != wantType {
		t.Fatalf("member type %d, want %d", g.Members[0].MemberType, wantType)
	}
}

// auditSASLHandshake: the mechanisms are listed and one is taken; v0 then
// authenticates with bare frames, v1 with SaslAuthenticate; an unknown
// mechanism is refused with the list.
func auditSASLHandshake(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.sasl.addr)
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = v, "OAUTHBEARER"
	bad := ask[*kmsg.SASLHandshakeResponse](t, rc, hs)
	if bad.ErrorCode != kerr.UnsupportedSaslMechanism.Code || !slices.Contains(bad.SupportedMechanisms, MechanismSCRAM256) {
		t.Fatalf("unknown mechanism: %v %v", kerr.ErrorForCode(bad.ErrorCode), bad.SupportedMechanisms)
	}
	rc = dialRaw(t, a.sasl.addr)
	authenticate(t, rc, v, a.sasl.addr, func(tok []byte) []byte {
		if v == 0 {
			rc.writeRaw(append(binaryLen(tok), tok...))
			frame, err := rc.readFrame()
			if err != nil {
				t.Fatalf("read token: %v", err)
			}
			return frame
		}
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version, req.SASLAuthBytes = 2, tok
		resp := ask[*kmsg.SASLAuthenticateResponse](t, rc, req)
		want(t, resp.ErrorCode, "authenticate")
		return resp.SASLAuthBytes
	})
}

// auditSASLAuthenticate: SCRAM completes over SaslAuthenticate v; v1+
// reports no session lifetime (no re-authentication); a wrong password
// fails with SASL_AUTHENTICATION_FAILED.
func auditSASLAuthenticate(t *testing.T, a *audit, v int16) {
	rc := dialRaw(t, a.sasl.addr)
	step := func(tok []byte) []byte {
		req := kmsg.NewPtrSASLAuthenticateRequest()
		req.Version, req.SASLAuthBytes = v, tok
		resp := ask[*kmsg.SASLAuthenticateResponse](t, rc, req)
		want(t, resp.ErrorCode, "authenticate")
		if resp.SessionLifetimeMillis != 0 {
			t.Fatalf("session lifetime %d", resp.SessionLifetimeMillis)
		}
		return resp.SASLAuthBytes
	}
	authenticate(t, rc, 1, a.sasl.addr, step)

	wrong := dialRaw(t, a.sasl.addr)
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = 1, MechanismSCRAM256
	want(t, ask[*kmsg.SASLHandshakeResponse](t, wrong, hs).ErrorCode, "handshake")
	_, tok, err := saslMech(MechanismSCRAM256, "audit", "not-the-password").Authenticate(context.Background(), a.sasl.addr)
	if err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrSASLAuthenticateRequest()
	req.Version, req.SASLAuthBytes = v, tok
	first := ask[*kmsg.SASLAuthenticateResponse](t, wrong, req)
	want(t, first.ErrorCode, "client-first")
	req = kmsg.NewPtrSASLAuthenticateRequest()
	req.Version, req.SASLAuthBytes = v, []byte("c=biws,r=x,p=AAAA")
	if got := ask[*kmsg.SASLAuthenticateResponse](t, wrong, req).ErrorCode; got != kerr.SaslAuthenticationFailed.Code {
		t.Fatalf("wrong proof: %v", kerr.ErrorForCode(got))
	}
}

// authenticate does a SCRAM-SHA-256 handshake at version hv and its
// exchange through step, then checks that Metadata is served.
func authenticate(t *testing.T, rc *rawConn, hv int16, addr string, step func([]byte) []byte) {
	t.Helper()
	hs := kmsg.NewPtrSASLHandshakeRequest()
	hs.Version, hs.Mechanism = hv, MechanismSCRAM256
	want(t, ask[*kmsg.SASLHandshakeResponse](t, rc, hs).ErrorCode, "handshake")
	sess, tok, err := saslMech(MechanismSCRAM256, "audit", "audit-pw").Authenticate(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	for done := false; !done; {
		if done, tok, err = sess.Challenge(step(tok)); err != nil {
			t.Fatalf("challenge: %v", err)
		}
	}
	req := kmsg.NewPtrMetadataRequest()
	req.Version = 9
	if resp := ask[*kmsg.MetadataResponse](t, rc, req); len(resp.Brokers) != 1 {
		t.Fatalf("metadata after authentication: %+v", resp.Brokers)
	}
}

func binaryLen(b []byte) []byte {
	n := len(b)
	return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
}
