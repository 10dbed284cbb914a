package protocol

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

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
	aclFile := filepath.Join(t.TempDir(), "acls.json")
	authz, err := NewAuthorizer(AuthorizerConfig{File: aclFile, SuperUsers: []string{"User:admin"}})
	if err != nil {
		t.Fatal(err)
	}
	var allow atomic.Bool
	f := setupSASL(t, map[string]string{"admin": "admin-pw", "alice": "alice-pw"}, func(c *Config) {
		c.Authorizer, c.AllowRepartition = authz, allow.Load
	})
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
