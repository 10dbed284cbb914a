package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/internal/e2e"
)

// The test binary doubles as a share group member (TestShareGroup...):
// with envShareMember set to the Kafka address it runs runShareMember
// until killed instead of the tests.
const envShareMember = "RELAY_FAULTS_SHARE_MEMBER"

const (
	shareGroup = "order-workers"
	shareDLQ   = "dlq.orders"
	// shareLimit is the group's share.delivery.count.limit.
	shareLimit = 5
)

// What a member does with an event, chosen from its id so that every
// member agrees.
const (
	doAccept       = "accept"
	doReject       = "reject"         // rejected at once: dead-letter topic
	doReleaseOnce  = "release-once"   // released at its first delivery, accepted later
	doReleaseAlway = "release-always" // released at every delivery: dead-letter topic at the limit
)

func shareAction(id string) string {
	h := fnv.New32a()
	h.Write([]byte(id))
	switch h.Sum32() % 50 {
	case 0:
		return doReject
	case 1:
		return doReleaseOnce
	case 2:
		return doReleaseAlway
	}
	return doAccept
}

// runShareMember consumes topic orders in the share group and prints, one
// line each, with the wall clock in nanoseconds second:
//
//	got <ns> <event id> <delivery count>       for each record delivered
//	acking <ns> <event id>:<action> ...        before a round's acks are sent
//	durable <ns> <event id> ...                once the broker answered them without error
func runShareMember(addr string) error {
	var mu sync.Mutex
	failed := false
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("orders"), kgo.ShareGroup(shareGroup),
		kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
			if !rs.Ok() {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		}))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx := context.Background()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		// The acking line is printed before any Ack call: franz-go may
		// send acknowledgements in the background as soon as they are
		// made, and the test must know of every acceptance sent.
		var acking, durable strings.Builder
		recs := fs.Records()
		acks := make([]kgo.AckStatus, len(recs))
		for i, r := range recs {
			var p e2e.Payload
			if err := json.Unmarshal(r.Value, &p); err != nil {
				return fmt.Errorf("record %d@%d: %v", r.Partition, r.Offset, err)
			}
			fmt.Printf("got %d %s %d\n", time.Now().UnixNano(), p.ID, r.DeliveryCount())
			do := shareAction(p.ID)
			switch {
			case do == doReject:
				acks[i] = kgo.AckReject
			case do == doReleaseAlway, do == doReleaseOnce && r.DeliveryCount() == 1:
				acks[i], do = kgo.AckRelease, "release"
			default:
				acks[i], do = kgo.AckAccept, doAccept
			}
			fmt.Fprintf(&acking, " %s:%s", p.ID, do)
			if do != "release" {
				fmt.Fprintf(&durable, " %s", p.ID)
			}
		}
		if acking.Len() == 0 {
			continue
		}
		fmt.Printf("acking %d%s\n", time.Now().UnixNano(), acking.String())
		for i, r := range recs {
			r.Ack(acks[i])
		}
		mu.Lock()
		failed = false
		mu.Unlock()
		if err := cl.FlushAcks(ctx); err != nil {
			continue
		}
		mu.Lock()
		ok := !failed
		mu.Unlock()
		if ok && durable.Len() > 0 {
			fmt.Printf("durable %d%s\n", time.Now().UnixNano(), durable.String())
		}
	}
}

// shareLog is what the test gathers from its members' output.
type shareLog struct {
	mu sync.Mutex
	// seen counts the complete lines read of each member.
	seen map[*e2e.Proc]int
	// durableAt is when a member's acceptance or rejection of an event
	// was answered; accepting holds the events some member sent an
	// acceptance of (answered or not).
	durableAt   map[string]int64
	accepting   map[string]bool
	came        map[string]int32 // highest delivery count seen
	violations  []string
	deliveries  int
	acceptances int
}

func (l *shareLog) read(m *e2e.Proc) {
	lines := strings.Split(m.Output(), "\n")
	lines = lines[:len(lines)-1] // the last may be incomplete
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range lines[min(l.seen[m], len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		at, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "got":
			l.deliveries++
			dc, _ := strconv.Atoi(f[3])
			l.came[f[2]] = max(l.came[f[2]], int32(dc))
			if d, ok := l.durableAt[f[2]]; ok && d < at {
				l.violations = append(l.violations, fmt.Sprintf("event %s delivered again (count %d) %v after its acknowledgement was answered",
					f[2], dc, time.Duration(at-d)))
			}
		case "acking":
			for _, a := range f[2:] {
				id, do, _ := strings.Cut(a, ":")
				if do == doAccept {
					l.accepting[id] = true
					l.acceptances++
				}
			}
		case "durable":
			for _, id := range f[2:] {
				if _, ok := l.durableAt[id]; !ok {
					l.durableAt[id] = at
				}
			}
		}
	}
	l.seen[m] = max(l.seen[m], len(lines))
}

func (l *shareLog) durable() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.durableAt)
}

// TestShareGroupOverOutboxSurvivesMemberAndRelayKills is issue 49's
// acceptance test with the relay binary: 10,000 outbox events written by
// concurrent writers into PostgreSQL, published by the relay and consumed
// through its Kafka listener by two share group members (separate
// processes running franz-go's share consumer); one member is SIGKILLed,
// then the relay is SIGKILLed and started again on its data directory,
// during consumption. The members accept most events, reject one in 50,
// release one in 50 at its first delivery only, and release one in 50 at
// every delivery. Then: every event to be accepted was sent an acceptance
// by some member (the one whose answer a SIGKILL cut counts: the relay
// may have saved it) and is not in the dead-letter topic; no event is
// delivered again after a member's acknowledgement of it was answered;
// the released-once events came back (delivery count above 1); the
// rejected events are in the dead-letter topic as rejected, and the
// always-released ones as past the delivery limit (never delivered past
// it), each with its relay-event-id; the relay's saved share state has
// everything settled.
func TestShareGroupOverOutboxSurvivesMemberAndRelayKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const events = 10000
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	kafkaAddr := e2e.FreeAddr(t)
	n := e.newNode("relay", "--kafka-addr", kafkaAddr, "--partitions", "2")
	n.start()
	e2e.WaitRole(t, n.proc, "leader", 30*time.Second)
	ledger := e2e.NewLedger()
	// The first events create the topic; the rest are written while the
	// members consume.
	first := e.writers(1000)
	if err := e2e.Write(ctx, first, ledger); err != nil {
		t.Fatal(err)
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	setGroupConfigs(t, ctx, adm, shareGroup, "share.auto.offset.reset", "earliest", "share.record.lock.duration.ms", "2000",
		"share.delivery.count.limit", strconv.Itoa(shareLimit), "errors.deadletterqueue.topic.name", shareDLQ)
	adm.Close()
	written := e2e.WriteAsync(ctx, e.writers(events-1000), ledger)

	log := &shareLog{seen: map[*e2e.Proc]int{}, durableAt: map[string]int64{}, accepting: map[string]bool{}, came: map[string]int32{}}
	member := func() *e2e.Proc { return e2e.Start(t, os.Args[0], []string{envShareMember + "=" + kafkaAddr}) }
	a, b := member(), member()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				saved, err := protocol.SavedShareGroups(e.dataDir)
				t.Fatalf("%s: %d events durably acknowledged when the test timed out; saved share state %+v (%v)\nmember a:\n%s\nmember b:\n%s",
					what, log.durable(), saved, err, tailOf(a.Output()), tailOf(b.Output()))
			}
			time.Sleep(50 * time.Millisecond) // condition poll: the members report through their output
			log.read(a)
			log.read(b)
		}
	}
	waitFor("both members consuming", func() bool {
		return strings.Contains(a.Output(), "durable ") && strings.Contains(b.Output(), "durable ")
	})
	waitFor("before killing a member", func() bool { return log.durable() >= 2000 })
	a.Kill()
	log.read(a)
	t.Logf("member a SIGKILLed at %d durable", log.durable())
	atKill := log.durable()
	waitFor("before killing the relay", func() bool { return log.durable() >= atKill+1500 })
	n.proc.Kill()
	t.Logf("relay SIGKILLed at %d durable", log.durable())
	if log.durable() >= events {
		t.Fatal("every event was acknowledged before the relay was killed: the test proved nothing")
	}
	n.start()
	e2e.WaitRole(t, n.proc, "leader", 30*time.Second)
	if err := <-written; err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitPublished(t, e.url, int64(ledger.Len()), time.Minute)
	waitFor("after the relay restart", func() bool {
		saved, err := protocol.SavedShareGroups(e.dataDir)
		if err != nil || len(saved) != 1 {
			return false
		}
		var settled int64
		for _, p := range saved[0].Partitions {
			if p.Topic != "orders" || p.Start != p.End || p.InFlight != 0 {
				return false
			}
			settled += p.End
		}
		return settled == int64(ledger.Len())
	})
	b.Kill()
	log.read(b)
	n.stop()
	e2e.CheckLog(t, e.dataDir, ledger)

	dead := map[string]e2e.Record{}
	for _, r := range e2e.ReadLog(t, e.dataDir, shareDLQ) {
		var p e2e.Payload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Errorf("dead letter %d: %v", r.Offset, err)
			continue
		}
		if r.Headers["relay-event-id"] == "" || r.Headers["__dlq.errors.topic"] != "orders" || r.Headers["__dlq.errors.group"] != shareGroup {
			t.Errorf("dead letter for event %s lacks its headers: %v", p.ID, r.Headers)
		}
		dead[p.ID] = r
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	counts := map[string]int{}
	cameBack := 0
	for id := range ledger.Committed {
		do := shareAction(id)
		counts[do]++
		d, isDead := dead[id]
		switch do {
		case doAccept, doReleaseOnce:
			if !log.accepting[id] {
				t.Errorf("event %s (%s) was never accepted (highest delivery count %d, dead letter %v)", id, do, log.came[id], isDead)
			}
			if isDead {
				t.Errorf("event %s (%s) went to the dead-letter topic: %v", id, do, d.Headers)
			}
			if do == doReleaseOnce && log.came[id] > 1 {
				cameBack++
			}
		case doReject:
			if log.accepting[id] {
				t.Errorf("rejected event %s was accepted", id)
			}
			if !isDead || d.Headers["__dlq.errors.reason"] != "rejected" {
				t.Errorf("rejected event %s: dead letter %v %v", id, isDead, d.Headers)
			}
		case doReleaseAlway:
			if log.accepting[id] {
				t.Errorf("always-released event %s was accepted", id)
			}
			if !isDead || d.Headers["__dlq.errors.reason"] != "delivery_limit" || d.Headers["__dlq.errors.delivery.count"] != strconv.Itoa(shareLimit) {
				t.Errorf("always-released event %s: dead letter %v %v", id, isDead, d.Headers)
			}
			// A delivery whose response a kill cut is counted but not
			// seen, so the highest seen may be below the limit.
			if log.came[id] > shareLimit {
				t.Errorf("always-released event %s delivered %d times, past the limit %d", id, log.came[id], shareLimit)
			}
		}
	}
	if cameBack == 0 || cameBack < counts[doReleaseOnce]*9/10 {
		t.Errorf("%d of %d released-once events came back", cameBack, counts[doReleaseOnce])
	}
	if len(dead) != counts[doReject]+counts[doReleaseAlway] {
		t.Errorf("the dead-letter topic has %d events, want %d rejected and %d past the limit", len(dead), counts[doReject], counts[doReleaseAlway])
	}
	t.Logf("%d events: %v; %d deliveries, %d acceptances sent, %d dead letters", ledger.Len(), counts, log.deliveries, log.acceptances, len(dead))
	if len(log.violations) > 0 {
		t.Fatalf("%d deliveries after an answered acknowledgement, first: %v", len(log.violations), log.violations[:min(5, len(log.violations))])
	}
}

// setGroupConfigs sets group configs through IncrementalAlterConfigs on
// the group resource, as Kafka's admin clients do.
func setGroupConfigs(t testing.TB, ctx context.Context, cl *kgo.Client, group string, kvs ...string) {
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
		t.Fatalf("IncrementalAlterConfigs %s: %v", group, err)
	}
}

func tailOf(s string) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}
