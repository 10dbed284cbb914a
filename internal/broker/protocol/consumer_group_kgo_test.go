package protocol

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// nextGenConsumer is a franz-go consumer on the KIP-848 protocol
// (kgo.ServerSideBalancer) that processes each poll before it lets the
// client rebalance, and commits what it processed when partitions are
// revoked, so a record is read once across rebalances.
type nextGenConsumer struct {
	name   string
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
}

func startNextGenConsumer(t *testing.T, addr, group, topic, name string, balancer kgo.GroupBalancer, seen *consumed) *nextGenConsumer {
	t.Helper()
	c := &nextGenConsumer{name: name}
	c.cl = newKgo(t, addr,
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ServerSideBalancer(),
		kgo.Balancers(balancer),
		kgo.BlockRebalanceOnPoll(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitInterval(100*time.Millisecond),
		kgo.ClientID(name),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, _ map[string][]int32) {
			if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: commit on revoke: %v", name, err)
			}
		}),
	)
	c.cancel, c.done = pollInto(c.cl, seen, c.cl.AllowRebalance)
	return c
}

// stop commits what was processed and leaves the group (member epoch -1).
func (c *nextGenConsumer) stop(t *testing.T, ctx context.Context) {
	t.Helper()
	c.cancel()
	<-c.done
	if err := c.cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Errorf("%s: final commit: %v", c.name, err)
	}
	c.cl.AllowRebalance()
	c.cl.Close()
}

// TestKgoConsumerGroupProtocol: three franz-go members on the new group
// protocol join one after the other (each join revokes partitions from
// the others before they are reassigned), one leaves and the other two
// take its partitions; with commits on revocation, every record is read
// exactly once and the group's commits end at the high watermark. Run
// for both server assignors.
func TestKgoConsumerGroupProtocol(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		assignor string
		balancer kgo.GroupBalancer
	}{
		{assignorUniform, kgo.CooperativeStickyBalancer()},
		{assignorRange, kgo.RangeBalancer()},
	} {
		t.Run(tc.assignor, func(t *testing.T) {
			t.Parallel()
			f := setupConsumerGroups(t, 3*time.Second)
			ctx := testContext(t, 90*time.Second)
			const topic, group, parts = "events", "next-gen", 6
			f.createTopic(t, topic, parts)
			prod := newKgo(t, f.addr)
			defer prod.Close()
			seen := &consumed{values: map[string]int{}, first: map[int32]int64{}}

			stable := func(members, each int) func() bool {
				return func() bool {
					d := describeConsumerGroup(t, f.addr, group)
					if d.ErrorCode != 0 || d.State != "Stable" || len(d.Members) != members || d.AssignorName != tc.assignor {
						return false
					}
					var all []int32
					for _, m := range d.Members {
						n := 0
						for _, tp := range m.Assignment.TopicPartitions {
							n += len(tp.Partitions)
							all = append(all, tp.Partitions...)
						}
						if n != each {
							return false
						}
					}
					slices.Sort(all)
					return slices.Equal(all, []int32{0, 1, 2, 3, 4, 5})
				}
			}

			cs := []*nextGenConsumer{startNextGenConsumer(t, f.addr, group, topic, "c0", tc.balancer, seen)}
			produceValues(t, ctx, prod, topic, 0, 600)
			waitFor(t, ctx, "the first member to read 600 records", func() bool { return seen.count() == 600 })

			var wg sync.WaitGroup
			wg.Go(func() { produceValues(t, ctx, prod, topic, 600, 1200) })
			for i := 1; i < 3; i++ {
				cs = append(cs, startNextGenConsumer(t, f.addr, group, topic, "c"+strconv.Itoa(i), tc.balancer, seen))
			}
			wg.Wait()
			waitFor(t, ctx, "three members with two partitions each", stable(3, 2))
			waitFor(t, ctx, "1200 records", func() bool { return seen.count() == 1200 })

			cs[2].stop(t, ctx)
			produceValues(t, ctx, prod, topic, 1200, 1800)
			waitFor(t, ctx, "two members with three partitions each", stable(2, 3))
			waitFor(t, ctx, "1800 records", func() bool { return seen.count() == 1800 })
			for _, c := range cs[:2] {
				c.stop(t, ctx)
			}

			seen.mu.Lock()
			for v, n := range seen.values {
				if n != 1 {
					t.Errorf("record %s read %d times", v, n)
				}
			}
			seen.mu.Unlock()
			for p := int32(0); p < parts; p++ {
				c, ok := f.b.FetchOffset(group, topic, p)
				_, hw, _ := f.b.Offsets(topic, p)
				if !ok || c.Offset != hw {
					t.Errorf("partition %d committed %d (ok=%v), want the high watermark %d", p, c.Offset, ok, hw)
				}
			}
		})
	}
}
