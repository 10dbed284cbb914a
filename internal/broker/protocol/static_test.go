package protocol

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// groupInfo reads the coordinator's view of a group.
func groupInfo(f *fixture, id string) (state groupState, generation int32, members int) {
	g := f.srv.groups.lockGroup(id, false)
	if g == nil {
		return groupDead, -1, 0
	}
	defer g.mu.Unlock()
	return g.state, g.generation, len(g.members)
}

func TestKgoStaticMembership(t *testing.T) {
	t.Parallel()
	const topic, group = "static", "static-group"
	f, ctx := setupTopic(t, topic, 4, 60*time.Second)
	seen := &consumed{values: map[string]int{}, first: map[int32]int64{}}

	a := startGroupConsumer(t, f.addr, group, topic, "a", seen, kgo.InstanceID("a"))
	b := startGroupConsumer(t, f.addr, group, topic, "b", seen, kgo.InstanceID("b"))
	waitFor(t, ctx, "a stable group of two, two partitions each", func() bool {
		st, _, n := groupInfo(f, group)
		return st == groupStable && n == 2 && len(a.partitions()) == 2 && len(b.partitions()) == 2
	})
	_, gen, _ := groupInfo(f, group)
	bParts := b.partitions()

	// A static member restarting within its session keeps its identity
	// and assignment: no rebalance, the generation stays.
	b.kill()
	b.cl.Close()
	b = startGroupConsumer(t, f.addr, group, topic, "b", seen, kgo.InstanceID("b"))
	waitFor(t, ctx, "the restarted static member to get its partitions back", func() bool { return slices.Equal(b.partitions(), bParts) })
	if st, gen2, n := groupInfo(f, group); gen2 != gen || n != 2 || st != groupStable {
		t.Fatalf("after static restart: state %v generation %d (was %d) members %d", st, gen2, gen, n)
	}

	// A static member that stays away past its session timeout is removed
	// and its partitions move.
	b.kill()
	b.cl.Close()
	waitFor(t, ctx, "the survivor to own every partition", func() bool { return len(a.partitions()) == 4 })
	if st, gen3, n := groupInfo(f, group); gen3 <= gen || n != 1 || st != groupStable {
		t.Fatalf("after static member expiry: state %v generation %d members %d", st, gen3, n)
	}
	if err := a.stop(ctx); err != nil {
		t.Fatal(err)
	}
}
