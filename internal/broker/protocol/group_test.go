package protocol

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// killableDialer lets a test cut a client off the network as if its
// process died: open connections drop and new dials fail, so it can
// neither heartbeat nor leave its group.
type killableDialer struct {
	mu     sync.Mutex
	dead   bool
	conns  []net.Conn
	dialer net.Dialer
}

func (d *killableDialer) dial(ctx context.Context, network, host string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, errors.New("test: client killed")
	}
	c, err := d.dialer.DialContext(ctx, network, host)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *killableDialer) kill() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// groupConsumer polls in the background, recording what it sees.
type groupConsumer struct {
	name   string
	cl     *kgo.Client
	dialer *killableDialer
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	assigned map[int32]bool
}

type consumed struct {
	mu sync.Mutex
	// first offset seen per partition by consumers started after a given
	// point, and every value seen.
	values map[string]int
	first  map[int32]int64
}

func (c *consumed) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.values)
}

// add records a consumed record: its value, and its offset if it is the
// first seen of its partition.
func (c *consumed) add(r *kgo.Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[string(r.Value)]++
	if _, ok := c.first[r.Partition]; !ok {
		c.first[r.Partition] = r.Offset
	}
}

// pollInto polls cl, adding each record to seen and calling afterPoll (if
// not nil) after each poll, until cancel; done is closed once it stopped.
func pollInto(cl *kgo.Client, seen *consumed, afterPoll func()) (cancel context.CancelFunc, done chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(seen.add)
			if afterPoll != nil {
				afterPoll()
			}
		}
	}()
	return cancel, done
}

func startGroupConsumer(t *testing.T, addr, group, topic, name string, seen *consumed, extra ...kgo.Opt) *groupConsumer {
	t.Helper()
	gc := &groupConsumer{name: name, dialer: &killableDialer{}, assigned: map[int32]bool{}}
	opts := append([]kgo.Opt{
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(1500 * time.Millisecond),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(5 * time.Second),
		kgo.AutoCommitInterval(100 * time.Millisecond),
		kgo.Dialer(gc.dialer.dial),
		kgo.ClientID(name),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			gc.mu.Lock()
			defer gc.mu.Unlock()
			for _, p := range m[topic] {
				gc.assigned[p] = true
			}
		}),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			if err := cl.CommitMarkedOffsets(ctx); err != nil && ctx.Err() == nil {
				t.Logf("%s: commit on revoke: %v", name, err)
			}
			gc.mu.Lock()
			defer gc.mu.Unlock()
			for _, p := range m[topic] {
				delete(gc.assigned, p)
			}
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			gc.mu.Lock()
			defer gc.mu.Unlock()
			for _, p := range m[topic] {
				delete(gc.assigned, p)
			}
		}),
	}, extra...)
	gc.cl = newKgo(t, addr, opts...)
	gc.cancel, gc.done = pollInto(gc.cl, seen, nil)
	return gc
}

func (gc *groupConsumer) partitions() []int32 {
	gc.mu.Lock()
	defer gc.mu.Unlock()
	var ps []int32
	for p := range gc.assigned {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

// kill cuts the consumer off without leaving the group.
func (gc *groupConsumer) kill() {
	gc.dialer.kill()
	gc.cancel()
	<-gc.done
}

// stop closes the consumer cleanly: commit, leave.
func (gc *groupConsumer) stop(ctx context.Context) error {
	gc.cancel()
	<-gc.done
	err := gc.cl.CommitUncommittedOffsets(ctx)
	gc.cl.Close()
	return err
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func produceValues(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, from, to int) {
	t.Helper()
	var rs []*kgo.Record
	for i := from; i < to; i++ {
		rs = append(rs, &kgo.Record{Topic: topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte(strconv.Itoa(i))})
	}
	if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

func TestKgoGroupFailoverAndRestart(t *testing.T) {
	t.Parallel()
	const topic, group, parts = "events", "workers", 6
	f, ctx := setupTopic(t, topic, parts, 90*time.Second)
	prod := newKgo(t, f.addr)
	defer prod.Close()

	seen := &consumed{values: map[string]int{}, first: map[int32]int64{}}
	var cs []*groupConsumer
	for i := range 3 {
		cs = append(cs, startGroupConsumer(t, f.addr, group, topic, "c"+strconv.Itoa(i), seen))
	}
	produceValues(t, ctx, prod, topic, 0, 1200)
	waitFor(t, ctx, "the first 1200 records", func() bool { return seen.count() == 1200 })
	waitFor(t, ctx, "two partitions per consumer", func() bool {
		for _, c := range cs {
			if len(c.partitions()) != 2 {
				return false
			}
		}
		return true
	})
	victim := cs[2]
	orphaned := victim.partitions()
	victim.kill()
	t.Logf("killed %s holding partitions %v", victim.name, orphaned)

	produceValues(t, ctx, prod, topic, 1200, 2400)
	waitFor(t, ctx, "the survivors to take over and consume everything", func() bool { return seen.count() == 2400 })
	waitFor(t, ctx, "the survivors to own all partitions", func() bool {
		var all []int32
		for _, c := range cs[:2] {
			all = append(all, c.partitions()...)
		}
		slices.Sort(all)
		return slices.Equal(all, []int32{0, 1, 2, 3, 4, 5})
	})
	victim.cl.Close()
	for _, c := range cs[:2] {
		if err := c.stop(ctx); err != nil {
			t.Fatalf("stop %s: %v", c.name, err)
		}
	}

	committed := map[int32]int64{}
	for p := int32(0); p < parts; p++ {
		c, ok := f.b.FetchOffset(group, topic, p)
		_, hw, _ := f.b.Offsets(topic, p)
		if !ok || c.Offset != hw {
			t.Fatalf("partition %d committed %d (ok=%v), want the high watermark %d", p, c.Offset, ok, hw)
		}
		committed[p] = c.Offset
	}

	// A restarted group resumes from its commits: nothing old again.
	again := &consumed{values: map[string]int{}, first: map[int32]int64{}}
	restarted := []*groupConsumer{
		startGroupConsumer(t, f.addr, group, topic, "r0", again),
		startGroupConsumer(t, f.addr, group, topic, "r1", again),
	}
	produceValues(t, ctx, prod, topic, 2400, 2700)
	waitFor(t, ctx, "the records produced after the restart", func() bool { return again.count() == 300 })
	for _, c := range restarted {
		if err := c.stop(ctx); err != nil {
			t.Fatalf("stop %s: %v", c.name, err)
		}
	}
	again.mu.Lock()
	defer again.mu.Unlock()
	for p, first := range again.first {
		if first != committed[p] {
			t.Errorf("restarted group began partition %d at %d, committed %d", p, first, committed[p])
		}
	}
	for v := range again.values {
		if n, _ := strconv.Atoi(v); n < 2400 {
			t.Errorf("restarted group re-read record %s", v)
		}
	}
	lags := f.srv.GroupLags()
	if len(lags) != parts {
		t.Fatalf("GroupLags = %+v, want %d partitions", lags, parts)
	}
	for _, l := range lags {
		if l.Group != group || l.Lag != 0 || l.RetentionMargin != l.HighWatermark {
			t.Errorf("lag %+v", l)
		}
	}
}

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
