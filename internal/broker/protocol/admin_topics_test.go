package protocol

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// TestCreatePartitionsAndDeleteTopics: through kadm, a principal without
// an ACL is refused both (TOPIC_AUTHORIZATION_FAILED, nothing changes); a
// super user's validate-only CreatePartitions reports the keys that would
// move, matching a count made with franz-go's own partitioner; the real
// one is refused (POLICY_VIOLATION) until the server allows repartition,
// then done; a decrease is always refused; DeleteTopics deletes, and the
// name cannot be created again until the broker reopens.
func TestCreatePartitionsAndDeleteTopics(t *testing.T) {
	t.Parallel()
	var allow atomic.Bool
	f, _ := setupACL(t, func(c *Config) { c.AllowRepartition = allow.Load })
	ctx := testContext(t, 60*time.Second)
	const topic = "orders"
	f.createTopic(t, topic, 3)
	keys := map[string]bool{}
	for i := range 120 {
		k := fmt.Sprintf("key-%d", i%97)
		keys[k] = true
		b := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: []byte(k), Value: []byte("v"), Timestamp: time.Now()}})
		if _, err := f.b.Append(ctx, topic, broker.PartitionForKey([]byte(k), 3), b); err != nil {
			t.Fatal(err)
		}
	}
	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	moving := 0
	for k := range keys {
		if part.Partition(&kgo.Record{Key: []byte(k)}, 3) != part.Partition(&kgo.Record{Key: []byte(k)}, 5) {
			moving++
		}
	}
	want := fmt.Sprintf("moves %d of the %d keys", moving, len(keys))

	alice := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw", kgo.RequestRetries(1)))
	if r, err := alice.UpdatePartitions(ctx, 5, topic); err != nil || !errors.Is(r[topic].Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice's CreatePartitions: %v %+v; want TOPIC_AUTHORIZATION_FAILED", err, r)
	}
	if r, err := alice.DeleteTopics(ctx, topic); err != nil || !errors.Is(r[topic].Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice's DeleteTopics: %v %+v; want TOPIC_AUTHORIZATION_FAILED", err, r)
	}
	if ti, err := f.b.Topic(topic); err != nil || len(ti.Partitions) != 3 {
		t.Fatalf("after alice's refused requests: %v, %d partitions", err, len(ti.Partitions))
	}

	admin := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "admin", "admin-pw", kgo.RequestRetries(1)))
	r, err := admin.ValidateUpdatePartitions(ctx, 5, topic)
	if err != nil || r[topic].Err != nil || !strings.Contains(r[topic].ErrMessage, want) {
		t.Fatalf("validate-only: %v %+v; want success and %q", err, r, want)
	}
	r, err = admin.UpdatePartitions(ctx, 5, topic)
	if err != nil || !errors.Is(r[topic].Err, kerr.PolicyViolation) || !strings.Contains(r[topic].ErrMessage, want) {
		t.Fatalf("without AllowRepartition: %v %+v; want POLICY_VIOLATION and %q", err, r, want)
	}
	allow.Store(true)
	if r, err := admin.UpdatePartitions(ctx, 2, topic); err != nil || !errors.Is(r[topic].Err, kerr.InvalidPartitions) {
		t.Fatalf("a decrease: %v %+v; want INVALID_PARTITIONS", err, r)
	}
	if r, err := admin.UpdatePartitions(ctx, 5, topic); err != nil || r[topic].Err != nil {
		t.Fatalf("with AllowRepartition: %v %+v", err, r)
	}
	if ti, err := f.b.Topic(topic); err != nil || len(ti.Partitions) != 5 {
		t.Fatalf("after the increase: %v, %d partitions", err, len(ti.Partitions))
	}

	if r, err := admin.DeleteTopics(ctx, topic); err != nil || r[topic].Err != nil {
		t.Fatalf("admin's DeleteTopics: %v %+v", err, r)
	}
	if _, err := f.b.Topic(topic); !errors.Is(err, broker.ErrUnknownTopicOrPartition) {
		t.Fatalf("after DeleteTopics: %v", err)
	}
	if _, err := f.b.CreateTopic(topic, broker.TopicConfig{}); !errors.Is(err, broker.ErrRecentlyDeleted) {
		t.Fatalf("creating the deleted name again before a reopen: %v, want ErrRecentlyDeleted", err)
	}
}

// TestAdminAPIsThroughKadm: DeleteRecords, DescribeLogDirs,
// DescribeCluster, DeleteGroups and OffsetDelete through kadm, each
// refused to a principal without the right (alice) and done for one
// with it (admin, a super user).
func TestAdminAPIsThroughKadm(t *testing.T) {
	t.Parallel()
	f, _ := setupACL(t, nil)
	ctx := testContext(t, 60*time.Second)
	const topic = "orders"
	f.createTopic(t, topic, 1)
	for range 10 {
		if _, err := f.b.Append(ctx, topic, 0, relayBatch("r")); err != nil {
			t.Fatal(err)
		}
	}
	aliceCl := f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw", kgo.RequestRetries(1))
	adminCl := f.kgoAs(t, MechanismSCRAM256, "admin", "admin-pw", kgo.RequestRetries(1))
	alice, admin := kadm.NewClient(aliceCl), kadm.NewClient(adminCl)

	// DeleteRecords: Delete on the topic; the relay's topics need an ACL.
	at4 := kadm.Offsets{topic: {0: {At: 4}}}
	if r, err := alice.DeleteRecords(ctx, at4); err != nil || !errors.Is(r[topic][0].Err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice's DeleteRecords: %v %+v", err, r)
	}
	if start, _, _ := f.b.Offsets(topic, 0); start != 0 {
		t.Fatalf("log start %d after a refused DeleteRecords", start)
	}
	r, err := admin.DeleteRecords(ctx, at4)
	if err != nil || r[topic][0].Err != nil || r[topic][0].LowWatermark != 4 {
		t.Fatalf("admin's DeleteRecords: %v %+v; want low watermark 4", err, r)
	}
	starts, err := admin.ListStartOffsets(ctx, topic)
	if s, _ := starts.Lookup(topic, 0); err != nil || s.Offset != 4 {
		t.Fatalf("ListOffsets earliest after DeleteRecords: %v %+v", err, s)
	}
	if _, err := f.b.Fetch(ctx, topic, 0, 3, 1<<20); !errors.Is(err, broker.ErrOffsetOutOfRange) {
		t.Fatalf("fetching below the new log start: %v", err)
	}
	if r, err := admin.DeleteRecords(ctx, kadm.Offsets{topic: {0: {At: 11}}}); err != nil || !errors.Is(r[topic][0].Err, kerr.OffsetOutOfRange) {
		t.Fatalf("DeleteRecords past the high watermark: %v %+v", err, r)
	}

	// DescribeLogDirs: Describe on the cluster.
	if _, err := alice.DescribeAllLogDirs(ctx, nil); !errors.Is(err, kerr.ClusterAuthorizationFailed) && !strings.Contains(fmt.Sprint(err), "CLUSTER_AUTHORIZATION_FAILED") {
		t.Fatalf("alice's DescribeLogDirs: %v", err)
	}
	dirs, err := admin.DescribeAllLogDirs(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ti, _ := f.b.Topic(topic)
	var size int64 = -1
	dirs.Each(func(d kadm.DescribedLogDir) {
		if p, ok := d.Topics.Lookup(topic, 0); ok {
			size = p.Size
		}
	})
	if size != ti.Partitions[0].Bytes || size <= 0 {
		t.Fatalf("DescribeLogDirs size %d, the partition holds %d bytes", size, ti.Partitions[0].Bytes)
	}

	// DescribeCluster: answered to all; the cluster's operations only to
	// those who may describe it.
	describe := func(cl *kgo.Client) *kmsg.DescribeClusterResponse {
		req := kmsg.NewPtrDescribeClusterRequest()
		req.IncludeClusterAuthorizedOperations = true
		resp, err := req.RequestWith(ctx, cl)
		if err != nil || resp.ErrorCode != 0 || len(resp.Brokers) != 1 || resp.ClusterID != DefaultClusterID {
			t.Fatalf("DescribeCluster: %v %+v", err, resp)
		}
		return resp
	}
	if ops := describe(aliceCl).ClusterAuthorizedOperations; ops != 0 {
		t.Fatalf("alice's cluster operations: %b, want none", ops)
	}
	if ops := describe(adminCl).ClusterAuthorizedOperations; ops&(1<<int(kmsg.ACLOperationAlter)) == 0 {
		t.Fatalf("admin's cluster operations: %b, want Alter among them", ops)
	}

	// DeleteGroups and OffsetDelete: Delete on the group (named by an
	// ACL for bob, so closed to alice).
	for _, g := range []string{"g1", "g2"} {
		if err := admin.CommitAllOffsets(ctx, g, kadm.Offsets{topic: {0: {At: 5}}}); err != nil {
			t.Fatal(err)
		}
	}
	acl, err := admin.CreateACLs(ctx, kadm.NewACLs().Allow("User:bob").Groups("g1", "g2").Operations(kadm.OpRead))
	if err != nil || acl[0].Err != nil {
		t.Fatalf("creating the ACL: %v %+v", err, acl)
	}
	if r, err := alice.DeleteGroups(ctx, "g1"); !errors.Is(err, kerr.GroupAuthorizationFailed) && !errors.Is(r["g1"].Err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("alice's DeleteGroups: %v %+v", err, r)
	}
	if _, err := alice.DeleteOffsets(ctx, "g2", kadm.TopicsSet{topic: {0: {}}}); !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Fatalf("alice's OffsetDelete: %v", err)
	}
	if len(f.b.GroupOffsets("g1")) != 1 || len(f.b.GroupOffsets("g2")) != 1 {
		t.Fatal("refused deletions deleted offsets")
	}
	if r, err := admin.DeleteGroups(ctx, "g1"); err != nil || r["g1"].Err != nil {
		t.Fatalf("admin's DeleteGroups: %v %+v", err, r)
	}
	if r, err := admin.DeleteGroups(ctx, "never"); err != nil || !errors.Is(r["never"].Err, kerr.GroupIDNotFound) {
		t.Fatalf("deleting an unknown group: %v %+v", err, r)
	}
	od, err := admin.DeleteOffsets(ctx, "g2", kadm.TopicsSet{topic: {0: {}}})
	if err != nil || od.Error() != nil {
		t.Fatalf("admin's OffsetDelete: %v %+v", err, od)
	}
	if len(f.b.GroupOffsets("g1")) != 0 || len(f.b.GroupOffsets("g2")) != 0 {
		t.Fatalf("after the deletions: g1 %v, g2 %v", f.b.GroupOffsets("g1"), f.b.GroupOffsets("g2"))
	}
	groups, err := admin.ListGroups(ctx)
	if err != nil || len(groups) != 0 {
		t.Fatalf("groups listed after deleting both: %v %+v", err, groups)
	}
}

// TestEveryAPIIsAuthorized: each API the listener advertises is named
// here with how it is authorized, so that a new one is not added without
// a rule (authorizeSync refuses one without, TestEveryAPIHasAnAuthorizationRule).
func TestEveryAPIIsAuthorized(t *testing.T) {
	checked := map[int16]string{
		kmsg.Produce.Int16(): "Write", kmsg.Fetch.Int16(): "Read", kmsg.ListOffsets.Int16(): "Describe", kmsg.Metadata.Int16(): "Describe",
		kmsg.OffsetCommit.Int16(): "Read", kmsg.OffsetFetch.Int16(): "Describe", kmsg.FindCoordinator.Int16(): "Describe",
		kmsg.JoinGroup.Int16(): "Read", kmsg.Heartbeat.Int16(): "Read", kmsg.LeaveGroup.Int16(): "Read", kmsg.SyncGroup.Int16(): "Read",
		kmsg.DescribeGroups.Int16(): "Describe", kmsg.ListGroups.Int16(): "Describe", kmsg.CreateTopics.Int16(): "Create",
		kmsg.DeleteTopics.Int16(): "Delete", kmsg.CreatePartitions.Int16(): "Alter", kmsg.DeleteRecords.Int16(): "Delete",
		kmsg.DescribeLogDirs.Int16(): "Describe cluster", kmsg.DescribeCluster.Int16(): "none (operations: Describe cluster)",
		kmsg.DeleteGroups.Int16(): "Delete", kmsg.OffsetDelete.Int16(): "Delete group, Read topic",
		kmsg.DescribeConfigs.Int16(): "DescribeConfigs", kmsg.AlterConfigs.Int16(): "AlterConfigs", kmsg.IncrementalAlterConfigs.Int16(): "AlterConfigs",
		kmsg.DescribeACLs.Int16(): "Describe cluster", kmsg.CreateACLs.Int16(): "Alter cluster", kmsg.DeleteACLs.Int16(): "Alter cluster",
		kmsg.ApiVersions.Int16(): "none", kmsg.SASLHandshake.Int16(): "none", kmsg.SASLAuthenticate.Int16(): "none",
		kmsg.InitProducerID.Int16():     "Write transactional id (none when idempotent: Write to produce)",
		kmsg.AddPartitionsToTxn.Int16(): "Write transactional id, Write topic", kmsg.AddOffsetsToTxn.Int16(): "Write transactional id, Read group",
		kmsg.TxnOffsetCommit.Int16(): "Write transactional id, Read group, Read topic", kmsg.EndTxn.Int16(): "Write transactional id",
		kmsg.DescribeTransactions.Int16(): "Describe transactional id", kmsg.ListTransactions.Int16(): "Describe transactional id",
		kmsg.ConsumerGroupHeartbeat.Int16(): "Read group, Describe subscribed topics", kmsg.ConsumerGroupDescribe.Int16(): "Describe group",
		// Share groups: TestACLsShareGroup.
		kmsg.ShareGroupHeartbeat.Int16(): "Read group", kmsg.ShareGroupDescribe.Int16(): "Describe group",
		kmsg.ShareFetch.Int16(): "Read group, Read topic", kmsg.ShareAcknowledge.Int16(): "Read group, Read topic",
		kmsg.DescribeShareGroupOffsets.Int16(): "Describe group", kmsg.AlterShareGroupOffsets.Int16(): "Read group",
		kmsg.DeleteShareGroupOffsets.Int16(): "Delete group",
	}
	for key := range supportedVersions {
		if _, ok := checked[key]; !ok {
			t.Errorf("API %s is advertised but not listed here: authorize it in authz.go, test it refused, and name it here", kmsg.NameForKey(key))
		}
	}
}

// TestCreatePartitionsMovingNoKey: without AllowRepartition, kadm's
// increase of an empty topic and of one holding only keyless records is
// made (no key's order is at stake), and a producer then writes to a new
// partition; an increase of a keyed topic that would move keys
// stays refused with POLICY_VIOLATION and changes nothing.
func TestCreatePartitionsMovingNoKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := testContext(t, 30*time.Second)
	f.createTopic(t, "empty", 2)
	f.createTopic(t, "keyless", 2)
	f.createTopic(t, "keyed", 2)
	for i := range 10 {
		if _, err := f.b.Append(ctx, "keyless", int32(i%2), broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte("v"), Timestamp: time.Now()}})); err != nil {
			t.Fatal(err)
		}
		k := []byte(fmt.Sprint("key-", i))
		if _, err := f.b.Append(ctx, "keyed", broker.PartitionForKey(k, 2), broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: k, Value: []byte("v"), Timestamp: time.Now()}})); err != nil {
			t.Fatal(err)
		}
	}
	cl := newKgo(t, f.addr, kgo.RequestRetries(1), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer cl.Close()
	adm := kadm.NewClient(cl)
	r, err := adm.UpdatePartitions(ctx, 4, "empty", "keyless", "keyed")
	if err != nil {
		t.Fatal(err)
	}
	for topic, want := range map[string]int{"empty": 4, "keyless": 4, "keyed": 2} {
		if want == 4 && r[topic].Err != nil {
			t.Errorf("%s: %v %q; want the increase made", topic, r[topic].Err, r[topic].ErrMessage)
		}
		if want == 2 && (!errors.Is(r[topic].Err, kerr.PolicyViolation) || !strings.Contains(r[topic].ErrMessage, "moves keys is a migration")) {
			t.Errorf("%s: %v %q; want POLICY_VIOLATION", topic, r[topic].Err, r[topic].ErrMessage)
		}
		if ti, err := f.b.Topic(topic); err != nil || len(ti.Partitions) != want {
			t.Errorf("%s: %d partitions (%v), want %d", topic, len(ti.Partitions), err, want)
		}
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "keyless", Partition: 3, Value: []byte("new")}).FirstErr(); err != nil {
		t.Fatalf("producing to a new partition: %v", err)
	}
	if _, end, err := f.b.Offsets("keyless", 3); err != nil || end != 1 {
		t.Fatalf("keyless/3 ends at %d (%v), want 1", end, err)
	}
}
