package protocol

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSecondServerLeavesGroupsAlone: the relay serves its data directory's
// admin socket with a second Server on the broker whose groups the Kafka
// listener coordinates. A second server that restored the saved
// memberships would arm session timers that no member renews (they
// heartbeat the listener), expire the members and save an empty group
// over the listener's: the next restart would then rebalance the group.
// With EphemeralGroups it neither restores nor saves, and the saved
// membership still names the live member long after its session timeout.
func TestSecondServerLeavesGroupsAlone(t *testing.T) {
	t.Parallel()
	f, ctx := setupTopic(t, "orders", 2, time.Minute)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.ConsumerGroup("durable"), kgo.ConsumeTopics("orders"),
		kgo.SessionTimeout(time.Second), kgo.HeartbeatInterval(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	go func() {
		for ctx.Err() == nil && !cl.PollFetches(ctx).IsClientClosed() {
		}
	}()
	members := func() int {
		raw, ok := f.b.GroupMembership("durable")
		if !ok {
			return -1
		}
		var sg savedGroup
		if err := json.Unmarshal(raw, &sg); err != nil {
			t.Fatalf("saved membership %q: %v", raw, err)
		}
		return len(sg.Members)
	}
	waitFor(t, ctx, "the group to be saved with its member", func() bool { return members() == 1 })

	second, err := NewServer(f.b, Config{Logger: testLogger(t), InitialRebalanceDelay: -1, EphemeralGroups: true})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	// Three session timeouts: a restored copy of the member would have
	// expired and been saved away by now.
	time.Sleep(3 * time.Second) // deliberate pause: three session timeouts (a negative check)
	if n := members(); n != 1 {
		t.Fatalf("the saved membership names %d members after a second server started, want the 1 live member", n)
	}
	if _, ok := second.groups.groups["durable"]; ok {
		t.Fatal("the second server restored the listener's group")
	}
}
