package protocol

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// aclFixture: TLS, SASL SCRAM for admin (a super user), alice and bob,
// and an Authorizer with an ACL file, every topic read-only (the relay's)
// unless an ACL allows writing it. cfg may adjust the server's Config.
func setupACL(t *testing.T, cfg func(*Config)) (*saslFixture, *Authorizer) {
	t.Helper()
	aclFile := filepath.Join(t.TempDir(), "acls.json")
	authz, err := NewAuthorizer(AuthorizerConfig{File: aclFile, SuperUsers: []string{"User:admin"}})
	if err != nil {
		t.Fatal(err)
	}
	f := setupSASL(t, map[string]string{"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}, func(c *Config) {
		c.Authorizer = authz
		if cfg != nil {
			cfg(c)
		}
	})
	return f, authz
}

// relayBatch is a record batch as the relay appends it, past the listener.
func relayBatch(value string) []byte {
	return broker.EncodeBatch(-1, -1, -1, []broker.Record{{Value: []byte(value), Timestamp: time.Now()}})
}

func produceErr(ctx context.Context, cl *kgo.Client, topic string) error {
	return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr()
}

// TestACLsProduceToRelayTopicsRefused: by default a client may read the
// relay's topics but not write them (TOPIC_AUTHORIZATION_FAILED, for
// franz-go and kcat alike); an ACL allowing alice to write a prefix lets
// her write there and nowhere else.
func TestACLsProduceToRelayTopicsRefused(t *testing.T) {
	t.Parallel()
	f, _ := setupACL(t, nil)
	ctx := testContext(t, 90*time.Second)
	const outboxTopic = "orders"
	f.createTopic(t, outboxTopic, 2)
	if _, err := f.b.Append(ctx, outboxTopic, 0, relayBatch("from-the-relay")); err != nil {
		t.Fatal(err)
	}

	alice := f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw", kgo.RequestRetries(1), kgo.AllowAutoTopicCreation(), kgo.ConsumeTopics(outboxTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err := produceErr(ctx, alice, outboxTopic); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice producing to the relay's topic: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if got := consumeAll(t, ctx, alice, 1); string(got[0].Value) != "from-the-relay" {
		t.Fatalf("alice read %q", got[0].Value)
	}
	out, err := tryKcat(t, ctx, "x\n", append(f.kcatArgs(MechanismSCRAM256, "alice", "alice-pw"), "-P", "-t", outboxTopic)...)
	if err == nil || !strings.Contains(out, "Broker: Topic authorization failed") {
		t.Errorf("kcat producing to the relay's topic: err %v, output:\n%s", err, out)
	}

	admin := kadm.NewClient(f.kgoAs(t, MechanismSCRAM512, "admin", "admin-pw"))
	res, err := admin.CreateACLs(ctx, kadm.NewACLs().Allow("User:alice").Topics("alice-").ResourcePatternType(kadm.ACLPatternPrefixed).Operations(kadm.OpWrite, kadm.OpCreate))
	if err != nil || res[0].Err != nil {
		t.Fatalf("create ACLs: %v %v", err, res)
	}
	if err := produceErr(ctx, alice, "alice-events"); err != nil {
		t.Fatalf("alice producing to her prefix: %v", err)
	}
	if err := produceErr(ctx, alice, outboxTopic); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice producing to the relay's topic after her ACL: %v", err)
	}
	bob := f.kgoAs(t, MechanismSCRAM256, "bob", "bob-pw", kgo.RequestRetries(1))
	if err := produceErr(ctx, bob, "alice-events"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("bob producing to alice's prefix: %v", err)
	}
}

// TestACLsGroupDeniesForeignGroup: once an ACL names a group, only the
// principals it allows may join it or commit for it; a foreign consumer
// gets GROUP_AUTHORIZATION_FAILED, and cannot see it in ListGroups.
func TestACLsGroupDeniesForeignGroup(t *testing.T) {
	t.Parallel()
	f, authz := setupACL(t, nil)
	ctx := testContext(t, 90*time.Second)
	const topic, group = "payments", "alice-group"
	f.createTopic(t, topic, 1)
	if _, err := f.b.Append(ctx, topic, 0, relayBatch("p1")); err != nil {
		t.Fatal(err)
	}
	if err := authz.create([]ACL{{ResourceType: kmsg.ACLResourceTypeGroup, Name: group, Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Principal: "User:alice", Host: "*", Operation: kmsg.ACLOperationRead, Permission: kmsg.ACLPermissionTypeAllow}}); err != nil {
		t.Fatal(err)
	}

	alice := f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw", kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if got := consumeAll(t, ctx, alice, 1); string(got[0].Value) != "p1" {
		t.Fatalf("alice read %q", got[0].Value)
	}
	if err := alice.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("alice commit: %v", err)
	}

	bob := f.kgoAs(t, MechanismSCRAM256, "bob", "bob-pw", kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic))
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var groupErr error
	for groupErr == nil && pctx.Err() == nil {
		bob.PollFetches(pctx).EachError(func(_ string, _ int32, err error) { groupErr = err })
	}
	if !errors.Is(groupErr, kerr.GroupAuthorizationFailed) {
		t.Fatalf("bob joining alice's group: %v, want GROUP_AUTHORIZATION_FAILED", groupErr)
	}
	bobAdm := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "bob", "bob-pw"))
	resps, err := bobAdm.CommitOffsets(ctx, group, kadm.OffsetsFromRecords(kgo.Record{Topic: topic, Partition: 0, Offset: 0}))
	if err == nil {
		err = resps.Error()
	}
	if !errors.Is(err, kerr.GroupAuthorizationFailed) {
		t.Errorf("bob committing for alice's group: %v, want GROUP_AUTHORIZATION_FAILED", err)
	}
	listed, err := bobAdm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := listed[group]; ok {
		t.Errorf("bob's ListGroups shows alice's group")
	}
	if c, ok := f.b.FetchOffset(group, topic, 0); !ok || c.Offset != 1 {
		t.Errorf("alice's committed offset %+v %v, want 1", c, ok)
	}
}

// TestACLAPIs: a super user creates, describes and deletes ACLs with
// kadm, and they survive in the ACL file; another user gets
// CLUSTER_AUTHORIZATION_FAILED.
func TestACLAPIs(t *testing.T) {
	t.Parallel()
	f, authz := setupACL(t, nil)
	ctx := testContext(t, 60*time.Second)
	admin := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "admin", "admin-pw"))
	b := kadm.NewACLs().Allow("User:bob").Topics("reports").Groups("reporting").Operations(kadm.OpRead, kadm.OpDescribe)
	res, err := admin.CreateACLs(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatalf("create %+v: %v", r, r.Err)
		}
	}
	desc, err := admin.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow("User:bob").AllowHosts("*").Operations(kadm.OpAny).ResourcePatternType(kadm.ACLPatternAny))
	if err != nil || desc[0].Err != nil {
		t.Fatalf("describe: %v %v", err, desc)
	}
	if n := len(desc[0].Described); n != 4 {
		t.Fatalf("described %d ACLs, want 4: %+v", n, desc[0].Described)
	}
	reloaded, err := NewAuthorizer(AuthorizerConfig{File: authz.cfg.File})
	if err != nil || len(reloaded.ACLs()) != 4 {
		t.Fatalf("ACL file reloaded: %v, %d ACLs", err, len(reloaded.ACLs()))
	}
	if st, err := os.Stat(authz.cfg.File); err != nil {
		t.Error(err)
	} else if st.Mode().Perm() != 0o600 {
		t.Errorf("ACL file mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := os.Stat(authz.cfg.File + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the ACL file's temporary file is left: %v", err)
	}

	alice := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw"))
	if res, err := alice.CreateACLs(ctx, kadm.NewACLs().Allow("User:alice").Clusters().Operations(kadm.OpAlter)); err == nil && !errors.Is(res[0].Err, kerr.ClusterAuthorizationFailed) {
		t.Errorf("alice creating ACLs: %v", res[0].Err)
	}
	if d, err := alice.DescribeACLs(ctx, kadm.NewACLs().AnyResource().Allow("User:bob").AllowHosts("*").Operations(kadm.OpAny).ResourcePatternType(kadm.ACLPatternAny)); err == nil && !errors.Is(d[0].Err, kerr.ClusterAuthorizationFailed) {
		t.Errorf("alice describing ACLs: %v", d[0].Err)
	}

	del, err := admin.DeleteACLs(ctx, kadm.NewACLs().Allow("User:bob").AllowHosts("*").Groups("reporting").Operations(kadm.OpAny))
	if err != nil || del[0].Err != nil || len(del[0].Deleted) != 2 {
		t.Fatalf("delete: %v %+v", err, del)
	}
	if n := len(authz.ACLs()); n != 2 {
		t.Errorf("%d ACLs left, want 2", n)
	}
}

// TestAuthorizerRules: deny wins over allow, Read implies Describe, a
// named resource is closed to principals its ACLs do not allow, and
// Describe/Alter on the cluster is never allowed by default.
func TestAuthorizerRules(t *testing.T) {
	t.Parallel()
	acl := func(rt kmsg.ACLResourceType, name string, pat kmsg.ACLResourcePatternType, who string, op kmsg.ACLOperation, perm kmsg.ACLPermissionType) ACL {
		return ACL{ResourceType: rt, Name: name, Pattern: pat, Principal: who, Host: "*", Operation: op, Permission: perm}
	}
	const topic, group = kmsg.ACLResourceTypeTopic, kmsg.ACLResourceTypeGroup
	lit, pre := kmsg.ACLResourcePatternTypeLiteral, kmsg.ACLResourcePatternTypePrefixed
	allow, deny := kmsg.ACLPermissionTypeAllow, kmsg.ACLPermissionTypeDeny
	a, err := NewAuthorizer(AuthorizerConfig{
		ReadOnlyTopics: func(t string) bool { return !strings.HasPrefix(t, "scratch-") },
		Initial: []ACL{
			acl(topic, "logs-", pre, "User:*", kmsg.ACLOperationRead, allow),
			acl(topic, "logs-secret", lit, "User:eve", kmsg.ACLOperationRead, deny),
			acl(group, "g", lit, "User:alice", kmsg.ACLOperationAll, allow),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  string
		op   kmsg.ACLOperation
		rt   kmsg.ACLResourceType
		name string
		want bool
	}{
		{"User:eve", kmsg.ACLOperationRead, topic, "logs-app", true},
		{"User:eve", kmsg.ACLOperationDescribe, topic, "logs-app", true},
		{"User:eve", kmsg.ACLOperationRead, topic, "logs-secret", false},
		{"User:eve", kmsg.ACLOperationWrite, topic, "logs-app", false},
		{"User:eve", kmsg.ACLOperationRead, topic, "unnamed", true},
		{"User:eve", kmsg.ACLOperationWrite, topic, "unnamed", false},
		{"User:eve", kmsg.ACLOperationWrite, topic, "scratch-1", true},
		{"User:alice", kmsg.ACLOperationRead, group, "g", true},
		{"User:bob", kmsg.ACLOperationRead, group, "g", false},
		{"User:bob", kmsg.ACLOperationRead, group, "other", true},
		{"User:bob", kmsg.ACLOperationAlter, kmsg.ACLResourceTypeCluster, clusterName, false},
		{"User:bob", kmsg.ACLOperationDescribe, kmsg.ACLResourceTypeCluster, clusterName, false},
	} {
		if got := a.Allowed(c.who, "127.0.0.1", c.op, c.rt, c.name); got != c.want {
			t.Errorf("%s %s %s %q: %v, want %v", c.who, c.op, c.rt, c.name, got, c.want)
		}
	}
}

// TestACLsTopicConfigs: alice may describe a relay topic's configs but not
// alter them (TOPIC_AUTHORIZATION_FAILED, the config unchanged) until an
// ACL allows AlterConfigs on it; admin, a super user, alters it.
func TestACLsTopicConfigs(t *testing.T) {
	t.Parallel()
	f, authz := setupACL(t, nil)
	ctx := testContext(t, 60*time.Second)
	f.createTopic(t, "orders", 1)
	alice := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw", kgo.RequestRetries(1)))
	retention := []kadm.AlterConfig{{Name: "retention.ms", Value: kadm.StringPtr("60000")}}
	alter := func(adm *kadm.Client, topic string) error {
		resps, err := adm.AlterTopicConfigs(ctx, retention, topic)
		if err != nil {
			return err
		}
		return resps[0].Err
	}

	rcs, err := alice.DescribeTopicConfigs(ctx, "orders")
	if err != nil || len(rcs) != 1 || rcs[0].Err != nil || len(rcs[0].Configs) == 0 {
		t.Fatalf("alice describing the relay topic: %+v, %v", rcs, err)
	}
	if err := alter(alice, "orders"); !errors.Is(err, kerr.TopicAuthorizationFailed) {
		t.Fatalf("alice altering the relay topic: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	if ti, _ := f.b.Topic("orders"); ti.Config.RetentionMs == 60000 {
		t.Fatal("a refused alteration changed the retention")
	}
	admin := kadm.NewClient(f.kgoAs(t, MechanismSCRAM256, "admin", "admin-pw", kgo.RequestRetries(1)))
	if err := alter(admin, "orders"); err != nil {
		t.Fatalf("admin altering the relay topic: %v", err)
	}
	if err := authz.create([]ACL{{ResourceType: kmsg.ACLResourceTypeTopic, Name: "orders", Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Principal: "User:alice", Host: "*", Operation: kmsg.ACLOperationAlterConfigs, Permission: kmsg.ACLPermissionTypeAllow}}); err != nil {
		t.Fatal(err)
	}
	if err := alter(alice, "orders"); err != nil {
		t.Fatalf("alice altering the relay topic with an ACL allowing it: %v", err)
	}
}
