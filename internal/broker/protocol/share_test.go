package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// setShareConfigs sets share group configs through IncrementalAlterConfigs
// on the group resource, as Kafka's admin clients do.
func setShareConfigs(t testing.TB, ctx context.Context, cl *kgo.Client, group string, kvs ...string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for i := 0; i < len(kvs); i += 2 {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Op, c.Value = kvs[i], kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(kvs[i+1])
		res.Configs = append(res.Configs, c)
	}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("IncrementalAlterConfigs: %v", err)
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		t.Fatalf("IncrementalAlterConfigs %s: %v (%v)", group, err, strOrEmpty(resp.Resources[0].ErrorMessage))
	}
}

func produceStrings(t *testing.T, ctx context.Context, cl *kgo.Client, topic string, partition int32, n int) {
	t.Helper()
	for i := range n {
		r := &kgo.Record{Topic: topic, Partition: partition, Value: fmt.Appendf(nil, "%d", i)}
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
}

// TestShareGroupTwoMembersAcceptOnce: two franz-go share consumers in one
// group split 400 records over two partitions; every record is delivered
// and accepted exactly once, and ShareGroupDescribe shows both members
// with both partitions assigned (the simple assignor shares them).
func TestShareGroupTwoMembersAcceptOnce(t *testing.T) {
	t.Parallel()
	f, ctx := setupTopic(t, "jobs", 2, 60*time.Second)
	admin, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	setShareConfigs(t, ctx, admin, "workers", "share.auto.offset.reset", "earliest")
	const perPart = 200
	produceStrings(t, ctx, admin, "jobs", 0, perPart)
	produceStrings(t, ctx, admin, "jobs", 1, perPart)

	var mu sync.Mutex
	accepted := map[[2]int64]int{}
	byMember := map[int]int{}
	all, done := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for m := range 2 {
		cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.ConsumeTopics("jobs"), kgo.ShareGroup("workers"), kgo.FetchMaxBytes(4096))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cl.Close()
			for {
				select {
				case <-done:
					return
				default:
				}
				pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
				fs := cl.PollFetches(pctx)
				cancel()
				if ctx.Err() != nil {
					return
				}
				for _, r := range fs.Records() {
					r.Ack(kgo.AckAccept)
					mu.Lock()
					accepted[[2]int64{int64(r.Partition), r.Offset}]++
					byMember[m]++
					if len(accepted) == 2*perPart {
						once.Do(func() { close(all) })
					}
					mu.Unlock()
				}
				if err := cl.FlushAcks(ctx); err != nil {
					t.Errorf("flush acks: %v", err)
				}
			}
		}()
	}
	select {
	case <-all:
	case <-ctx.Done():
	}
	// Both members are still in the group (they poll until done); describe
	// it now.
	dreq := kmsg.NewPtrShareGroupDescribeRequest()
	dreq.GroupIDs = []string{"workers"}
	var dresp *kmsg.ShareGroupDescribeResponse
	for ctx.Err() == nil {
		// A member that got nothing yet may still be joining.
		if dresp, err = dreq.RequestWith(ctx, admin); err != nil || len(dresp.Groups[0].Members) == 2 {
			break
		}
		time.Sleep(50 * time.Millisecond) // condition poll: membership is the broker's
	}
	close(done)
	wg.Wait()
	if err != nil || dresp == nil {
		t.Fatalf("describe: %v (%v)", err, ctx.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(accepted) != 2*perPart {
		t.Fatalf("accepted %d distinct records, want %d", len(accepted), 2*perPart)
	}
	for k, n := range accepted {
		if n != 1 {
			t.Errorf("record %v accepted %d times", k, n)
		}
	}
	g := dresp.Groups[0]
	if g.ErrorCode != 0 || g.GroupState != "Stable" || len(g.Members) != 2 {
		t.Fatalf("describe: error %d state %q members %d, want a stable group of 2", g.ErrorCode, g.GroupState, len(g.Members))
	}
	for _, m := range g.Members {
		if len(m.Assignment.TopicPartitions) != 1 || len(m.Assignment.TopicPartitions[0].Partitions) != 2 {
			t.Errorf("member %s assignment %+v: want both partitions of jobs", m.MemberID, m.Assignment.TopicPartitions)
		}
	}
	t.Logf("records per member: %v", byMember)
}

// TestShareGroupReleaseAndReject: a record released comes back with a
// higher delivery count; a rejected one never does; when all is settled
// the share partition's start offset is the log end and nothing is in
// flight.
func TestShareGroupReleaseAndReject(t *testing.T) {
	t.Parallel()
	f, ctx := setupTopic(t, "tasks", 1, 60*time.Second)
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.ConsumeTopics("tasks"), kgo.ShareGroup("g"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	setShareConfigs(t, ctx, cl, "g", "share.auto.offset.reset", "earliest")
	const n = 30
	produceStrings(t, ctx, cl, "tasks", 0, n)

	deliveries := map[int64][]int32{}
	settled := 0
	for settled < n && ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			deliveries[r.Offset] = append(deliveries[r.Offset], r.DeliveryCount())
			switch {
			case r.Offset%3 == 0 && r.DeliveryCount() == 1:
				r.Ack(kgo.AckRelease)
			case r.Offset%3 == 1:
				r.Ack(kgo.AckReject)
				settled++
			default:
				r.Ack(kgo.AckAccept)
				settled++
			}
		}
		if err := cl.FlushAcks(ctx); err != nil {
			t.Fatalf("flush acks: %v", err)
		}
	}
	if settled != n {
		t.Fatalf("settled %d of %d records", settled, n)
	}
	for o := int64(0); o < n; o++ {
		want := []int32{1}
		if o%3 == 0 {
			want = []int32{1, 2}
		}
		if fmt.Sprint(deliveries[o]) != fmt.Sprint(want) {
			t.Errorf("offset %d delivered with counts %v, want %v", o, deliveries[o], want)
		}
	}
	g := f.srv.share.group("g", false)
	g.mu.Lock()
	sp := g.parts[topicPart{topic: "tasks", partition: 0}]
	start, end, inflight := sp.start, sp.end, len(sp.recs)
	g.mu.Unlock()
	if start != n || end != n || inflight != 0 {
		t.Fatalf("share partition start %d end %d in flight %d, want %d, %d, 0", start, end, inflight, n, n)
	}
}

// rawShare speaks the share protocol by hand, to hold acquisition locks
// without acknowledging (franz-go's consumer acknowledges or releases
// everything it polled).
type rawShare struct {
	t      *testing.T
	cl     *kgo.Client
	group  string
	member string
	epoch  int32
}

func newRawShare(t *testing.T, ctx context.Context, addr, group, member, topic string) *rawShare {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	hb := kmsg.NewPtrShareGroupHeartbeatRequest()
	hb.GroupID, hb.MemberID, hb.MemberEpoch, hb.SubscribedTopicNames = group, member, 0, []string{topic}
	resp, err := hb.RequestWith(ctx, cl)
	if err != nil || resp.ErrorCode != 0 {
		t.Fatalf("share heartbeat: %v %v", err, resp)
	}
	if resp.Assignment == nil || len(resp.Assignment.TopicPartitions) != 1 {
		t.Fatalf("share heartbeat: assignment %+v, want the topic", resp.Assignment)
	}
	return &rawShare{t: t, cl: cl, group: group, member: member}
}

// fetch sends one ShareFetch of partition 0 of topic with acks, and
// returns the acquired ranges.
func (r *rawShare) fetch(ctx context.Context, topic string, acks []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch) []kmsg.ShareFetchResponseTopicPartitionAcquiredRecord {
	r.t.Helper()
	req := kmsg.NewPtrShareFetchRequest()
	req.GroupID, req.MemberID, req.ShareSessionEpoch = &r.group, &r.member, r.epoch
	req.MaxWaitMillis, req.MinBytes, req.MaxBytes, req.MaxRecords = 200, 1, 1<<20, 100
	rt := kmsg.NewShareFetchRequestTopic()
	rt.TopicID = topicID(topic)
	rp := kmsg.NewShareFetchRequestTopicPartition()
	rp.PartitionMaxBytes, rp.AcknowledgementBatches = 1<<20, acks
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	b, err := r.cl.Broker(int(nodeID)).RetriableRequest(ctx, req)
	if err != nil {
		r.t.Fatalf("share fetch: %v", err)
	}
	resp := b.(*kmsg.ShareFetchResponse)
	if resp.ErrorCode != 0 {
		r.t.Fatalf("share fetch: %v", kerr.ErrorForCode(resp.ErrorCode))
	}
	r.epoch++
	var out []kmsg.ShareFetchResponseTopicPartitionAcquiredRecord
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 || p.AcknowledgeErrorCode != 0 {
				r.t.Fatalf("share fetch partition: %v / ack %v", kerr.ErrorForCode(p.ErrorCode), kerr.ErrorForCode(p.AcknowledgeErrorCode))
			}
			out = append(out, p.AcquiredRecords...)
		}
	}
	return out
}

func ranges(acq []kmsg.ShareFetchResponseTopicPartitionAcquiredRecord) string {
	s := ""
	for _, a := range acq {
		s += fmt.Sprintf("[%d-%d]x%d", a.FirstOffset, a.LastOffset, a.DeliveryCount)
	}
	return s
}

func accept(first, last int64) []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch {
	b := kmsg.NewShareFetchRequestTopicPartitionAcknowledgementBatch()
	b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{ackAccept}
	return []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch{b}
}

// TestShareGroupLockTimeoutAndDeliveryLimit: records a member acquires and
// never acknowledges come back to another member when their lock times
// out, with a higher delivery count, until the delivery limit archives
// them; acknowledging a record one does not hold is INVALID_RECORD_STATE.
func TestShareGroupLockTimeoutAndDeliveryLimit(t *testing.T) {
	t.Parallel()
	f, ctx := setupTopic(t, "locks", 1, 60*time.Second)
	a := newRawShare(t, ctx, f.addr, "lg", "member-a", "locks")
	b := newRawShare(t, ctx, f.addr, "lg", "member-b", "locks")
	setShareConfigs(t, ctx, a.cl, "lg", "share.auto.offset.reset", "earliest",
		"share.record.lock.duration.ms", "1000", "share.delivery.count.limit", "2")
	produceStrings(t, ctx, a.cl, "locks", 0, 5)

	if got := ranges(a.fetch(ctx, "locks", nil)); got != "[0-4]x1" {
		t.Fatalf("first fetch acquired %s, want [0-4]x1", got)
	}
	if m := shareMetrics(t, f.srv, "lg"); m["relay_kafka_share_group_acquired_records"] != 5 ||
		m["relay_kafka_share_group_lag_records"] != 5 || m["relay_kafka_share_group_members"] != 2 {
		t.Fatalf("metrics with 5 records acquired by one of 2 members: %v", m)
	}
	// b gets nothing while a holds the locks, then everything again once
	// they time out (within a second).
	var got string
	for got == "" && ctx.Err() == nil {
		got = ranges(b.fetch(ctx, "locks", nil))
	}
	if got != "[0-4]x2" {
		t.Fatalf("after the lock timeout b acquired %s, want [0-4]x2", got)
	}
	// a's locks are gone: its acknowledgement is refused.
	req := kmsg.NewPtrShareAcknowledgeRequest()
	req.GroupID, req.MemberID, req.ShareSessionEpoch = &a.group, &a.member, a.epoch
	rt := kmsg.NewShareAcknowledgeRequestTopic()
	rt.TopicID = topicID("locks")
	rp := kmsg.NewShareAcknowledgeRequestTopicPartition()
	ab := kmsg.NewShareAcknowledgeRequestTopicPartitionAcknowledgementBatch()
	ab.FirstOffset, ab.LastOffset, ab.AcknowledgeTypes = 0, 0, []int8{ackAccept}
	rp.AcknowledgementBatches = append(rp.AcknowledgementBatches, ab)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	aresp, err := req.RequestWith(ctx, a.cl)
	if err != nil {
		t.Fatal(err)
	}
	if code := aresp.Topics[0].Partitions[0].ErrorCode; code != kerr.InvalidRecordState.Code {
		t.Fatalf("acknowledging a record held by another member: %v, want INVALID_RECORD_STATE", kerr.ErrorForCode(code))
	}
	a.epoch++
	// b lets its locks time out too: delivered twice, the limit, so the
	// records are archived and the partition is done.
	g := f.srv.share.group("lg", false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := ranges(a.fetch(ctx, "locks", nil)); got != "" {
			t.Fatalf("records past the delivery limit were delivered again: %s", got)
		}
		g.mu.Lock()
		sp := g.parts[topicPart{topic: "locks", partition: 0}]
		start, inflight := sp.start, len(sp.recs)
		g.mu.Unlock()
		if start == 5 && inflight == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("records not archived: start %d, %d in flight", start, inflight)
		}
	}
}

// TestShareStateSurvivesRestart: records accepted before a restart are not
// delivered again after it; records acquired but not acknowledged come
// back (with their delivery count); the group's configs persist.
func TestShareStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func() (addr string, srv *Server, stop func()) {
		b, err := broker.Open(context.Background(), broker.Options{Dir: dir, JanitorInterval: -1, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		srv, err = NewServer(b, Config{AutoCreateTopics: true, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln.Addr().String(), srv, serve(t, context.Background(), srv, ln, b)
	}
	ctx := testContext(t, 60*time.Second)
	addr, srv, stop := start()
	if _, err := srv.b.CreateTopic("durable", broker.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	a := newRawShare(t, ctx, addr, "dg", "member-a", "durable")
	setShareConfigs(t, ctx, a.cl, "dg", "share.auto.offset.reset", "earliest")
	produceStrings(t, ctx, a.cl, "durable", 0, 10)
	if got := ranges(a.fetch(ctx, "durable", nil)); got != "[0-9]x1" {
		t.Fatalf("fetch acquired %s, want [0-9]x1", got)
	}
	if got := ranges(a.fetch(ctx, "durable", accept(0, 4))); got != "" {
		t.Fatalf("second fetch acquired %s, want nothing", got)
	}
	a.cl.Close()
	stop()

	addr, srv, stop = start()
	defer stop()
	b := newRawShare(t, ctx, addr, "dg", "member-b", "durable")
	if got := ranges(b.fetch(ctx, "durable", nil)); got != "[5-9]x2" {
		t.Fatalf("after restart acquired %s, want [5-9]x2", got)
	}
	if got := ranges(b.fetch(ctx, "durable", accept(5, 9))); got != "" {
		t.Fatalf("after accepting everything acquired %s, want nothing", got)
	}
	g := srv.share.group("dg", false)
	g.mu.Lock()
	earliest := g.cfg.Earliest
	g.mu.Unlock()
	if !earliest {
		t.Fatal("share.auto.offset.reset=earliest did not survive the restart")
	}
}

// TestShareStateRestartArchivesAtTheLimit: records saved while acquired
// for their last allowed delivery are archived at restore, with their
// dead letters written, and never delivered past the limit (the relay
// acceptance test over the outbox found them delivered limit+1 times).
func TestShareStateRestartArchivesAtTheLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start := func() (addr string, srv *Server, b *broker.Broker, stop func()) {
		b, err := broker.Open(context.Background(), broker.Options{Dir: dir, JanitorInterval: -1, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		srv, err = NewServer(b, Config{AutoCreateTopics: true, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln.Addr().String(), srv, b, serve(t, context.Background(), srv, ln, b)
	}
	ctx := testContext(t, 60*time.Second)
	addr, srv, _, stop := start()
	if _, err := srv.b.CreateTopic("limited", broker.TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	a := newRawShare(t, ctx, addr, "lg", "member-a", "limited")
	setShareConfigs(t, ctx, a.cl, "lg", "share.auto.offset.reset", "earliest", "share.delivery.count.limit", "2",
		"errors.deadletterqueue.topic.name", "dlq.limited")
	produceStrings(t, ctx, a.cl, "limited", 0, 4)
	if got := ranges(a.fetch(ctx, "limited", nil)); got != "[0-3]x1" {
		t.Fatalf("fetch acquired %s, want [0-3]x1", got)
	}
	rel := []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch{ackAs(0, 3, ackRelease)}
	if got := ranges(a.fetch(ctx, "limited", rel)); got != "[0-3]x2" {
		t.Fatalf("after the release acquired %s, want [0-3]x2", got)
	}
	// Accepting 0 saves the state with 1-3 acquired at the limit.
	if got := ranges(a.fetch(ctx, "limited", accept(0, 0))); got != "" {
		t.Fatalf("after accepting 0 acquired %s, want nothing", got)
	}
	a.cl.Close()
	stop()

	addr, _, b, stop := start()
	defer stop()
	m := newRawShare(t, ctx, addr, "lg", "member-b", "limited")
	if got := ranges(m.fetch(ctx, "limited", nil)); got != "" {
		t.Fatalf("after restart acquired %s, want nothing: 1-3 were delivered twice, the limit", got)
	}
	if _, end, err := b.Offsets("dlq.limited", 0); err != nil || end != 3 {
		t.Fatalf("dead-letter topic ends at %d (%v), want the 3 records past the limit", end, err)
	}
	saved, err := SavedShareGroups(dir)
	if err != nil || len(saved) != 1 || len(saved[0].Partitions) != 1 {
		t.Fatalf("saved share state %+v (%v)", saved, err)
	}
	if p := saved[0].Partitions[0]; p.Start != 4 || p.End != 4 || p.InFlight != 0 {
		t.Fatalf("saved share partition %+v, want everything settled at 4", p)
	}
}

func ackAs(first, last int64, typ int8) kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch {
	b := kmsg.NewShareFetchRequestTopicPartitionAcknowledgementBatch()
	b.FirstOffset, b.LastOffset, b.AcknowledgeTypes = first, last, []int8{typ}
	return b
}

// TestShareGroupDeadLetters: with errors.deadletterqueue.topic.name set,
// rejected records and a record released past the delivery limit are
// copied to the dead-letter topic with their origin, delivery count and
// reason, and keep their relay-event-id header; accepted ones are not.
func TestShareGroupDeadLetters(t *testing.T) {
	t.Parallel()
	f, ctx := setupTopic(t, "orders", 1, 60*time.Second)
	a := newRawShare(t, ctx, f.addr, "dl", "member-a", "orders")
	setShareConfigs(t, ctx, a.cl, "dl", "share.auto.offset.reset", "earliest",
		"share.delivery.count.limit", "2", "errors.deadletterqueue.topic.name", "dlq.orders")
	for i := range 6 {
		r := &kgo.Record{Topic: "orders", Value: fmt.Appendf(nil, "order-%d", i),
			Headers: []kgo.RecordHeader{{Key: "relay-event-id", Value: fmt.Appendf(nil, "ev-%d", i)}}}
		if err := a.cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if got := ranges(a.fetch(ctx, "orders", nil)); got != "[0-5]x1" {
		t.Fatalf("fetch acquired %s, want [0-5]x1", got)
	}
	acks := []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch{
		ackAs(0, 1, ackReject), ackAs(2, 2, ackRelease), ackAs(3, 5, ackAccept)}
	if got := ranges(a.fetch(ctx, "orders", acks)); got != "[2-2]x2" {
		t.Fatalf("after the acknowledgements acquired %s, want the released [2-2]x2", got)
	}
	if got := ranges(a.fetch(ctx, "orders", []kmsg.ShareFetchRequestTopicPartitionAcknowledgementBatch{ackAs(2, 2, ackRelease)})); got != "" {
		t.Fatalf("a record released at the delivery limit came back: %s", got)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(f.addr), kgo.ConsumeTopics("dlq.orders"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []string
	for len(got) < 3 && ctx.Err() == nil {
		for _, r := range cl.PollFetches(ctx).Records() {
			h := map[string]string{}
			for _, kv := range r.Headers {
				h[kv.Key] = string(kv.Value)
			}
			got = append(got, fmt.Sprintf("%s %s %s/%s@%s count=%s reason=%s", r.Value, h["relay-event-id"], h["__dlq.errors.group"],
				h["__dlq.errors.topic"], h["__dlq.errors.offset"], h["__dlq.errors.delivery.count"], h["__dlq.errors.reason"]))
		}
	}
	want := []string{
		"order-0 ev-0 dl/orders@0 count=1 reason=rejected",
		"order-1 ev-1 dl/orders@1 count=1 reason=rejected",
		"order-2 ev-2 dl/orders@2 count=2 reason=delivery_limit",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters:\n%q\nwant\n%q", got, want)
	}
	_, end, err := f.b.Offsets("dlq.orders", 0)
	if err != nil || end != 3 {
		t.Fatalf("dead-letter topic ends at %d (%v), want 3 records", end, err)
	}
}

// shareMetrics gathers the server's share group metrics of group, summed
// over partitions, by name.
func shareMetrics(t *testing.T, srv *Server, group string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "group" && l.GetValue() == group && strings.HasPrefix(mf.GetName(), "relay_kafka_share_group_") {
					out[mf.GetName()] += m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

// TestACLsShareGroup: a share group named by an ACL admits only the
// principals it allows: bob's ShareGroupHeartbeat (or finding its
// coordinator), ShareFetch and ShareGroupDescribe of alice's group get
// GROUP_AUTHORIZATION_FAILED, while alice joins and fetches.
func TestACLsShareGroup(t *testing.T) {
	t.Parallel()
	f, authz := setupACL(t, nil)
	ctx := testContext(t, 60*time.Second)
	const topic, group = "tickets", "alice-share"
	f.createTopic(t, topic, 1)
	if err := authz.create([]ACL{{ResourceType: kmsg.ACLResourceTypeGroup, Name: group, Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Principal: "User:alice", Host: "*", Operation: kmsg.ACLOperationRead, Permission: kmsg.ACLPermissionTypeAllow}}); err != nil {
		t.Fatal(err)
	}
	heartbeat := func(cl *kgo.Client, member string) int16 {
		t.Helper()
		req := kmsg.NewPtrShareGroupHeartbeatRequest()
		req.GroupID, req.MemberID, req.SubscribedTopicNames = group, member, []string{topic}
		resp, err := req.RequestWith(ctx, cl)
		if errors.Is(err, kerr.GroupAuthorizationFailed) {
			return kerr.GroupAuthorizationFailed.Code // refused finding the coordinator
		}
		if err != nil {
			t.Fatal(err)
		}
		return resp.ErrorCode
	}
	fetch := func(cl *kgo.Client, member string) int16 {
		t.Helper()
		g := group
		req := kmsg.NewPtrShareFetchRequest()
		req.GroupID, req.MemberID, req.MaxRecords = &g, &member, 10
		rt := kmsg.NewShareFetchRequestTopic()
		rt.TopicID = topicID(topic)
		rt.Partitions = append(rt.Partitions, kmsg.NewShareFetchRequestTopicPartition())
		req.Topics = append(req.Topics, rt)
		resp, err := cl.Broker(int(nodeID)).RetriableRequest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.(*kmsg.ShareFetchResponse).ErrorCode
	}
	alice := f.kgoAs(t, MechanismSCRAM256, "alice", "alice-pw")
	bob := f.kgoAs(t, MechanismSCRAM256, "bob", "bob-pw")
	if code := heartbeat(alice, "a1"); code != 0 {
		t.Fatalf("alice joining her share group: %v", kerr.ErrorForCode(code))
	}
	if code := fetch(alice, "a1"); code != 0 {
		t.Fatalf("alice fetching: %v", kerr.ErrorForCode(code))
	}
	if code := heartbeat(bob, "b1"); code != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob joining alice's share group: %v, want GROUP_AUTHORIZATION_FAILED", kerr.ErrorForCode(code))
	}
	if code := fetch(bob, "b1"); code != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob fetching from alice's share group: %v, want GROUP_AUTHORIZATION_FAILED", kerr.ErrorForCode(code))
	}
	// The rest go to the broker directly: through the client, finding
	// the coordinator would be refused first.
	send := func(req kmsg.Request) kmsg.Response {
		t.Helper()
		resp, err := bob.Broker(int(nodeID)).RetriableRequest(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	g, member := group, "b1"
	dreq := kmsg.NewPtrShareGroupDescribeRequest()
	dreq.GroupIDs = []string{group}
	if dresp := send(dreq).(*kmsg.ShareGroupDescribeResponse); len(dresp.Groups) != 1 || dresp.Groups[0].ErrorCode != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob describing alice's share group: %+v, want GROUP_AUTHORIZATION_FAILED", dresp.Groups)
	}
	areq := kmsg.NewPtrShareAcknowledgeRequest()
	areq.GroupID, areq.MemberID, areq.ShareSessionEpoch = &g, &member, 1
	if code := send(areq).(*kmsg.ShareAcknowledgeResponse).ErrorCode; code != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob acknowledging in alice's share group: %v, want GROUP_AUTHORIZATION_FAILED", kerr.ErrorForCode(code))
	}
	oreq := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	og := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	og.GroupID = group
	oreq.Groups = append(oreq.Groups, og)
	if oresp := send(oreq).(*kmsg.DescribeShareGroupOffsetsResponse); len(oresp.Groups) != 1 || oresp.Groups[0].ErrorCode != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob describing alice's share offsets: %+v, want GROUP_AUTHORIZATION_FAILED", oresp.Groups)
	}
	alter := kmsg.NewPtrAlterShareGroupOffsetsRequest()
	alter.GroupID = group
	if code := send(alter).(*kmsg.AlterShareGroupOffsetsResponse).ErrorCode; code != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob altering alice's share offsets: %v, want GROUP_AUTHORIZATION_FAILED", kerr.ErrorForCode(code))
	}
	del := kmsg.NewPtrDeleteShareGroupOffsetsRequest()
	del.GroupID = group
	if code := send(del).(*kmsg.DeleteShareGroupOffsetsResponse).ErrorCode; code != kerr.GroupAuthorizationFailed.Code {
		t.Fatalf("bob deleting alice's share offsets: %v, want GROUP_AUTHORIZATION_FAILED", kerr.ErrorForCode(code))
	}
}
