package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// testFence is a session fence the test trips.
type testFence struct{ tripped atomic.Bool }

func (f *testFence) Fence() error {
	if f.tripped.Load() {
		return fmt.Errorf("%w: the test tripped the fence", relay.ErrNotLeader)
	}
	return nil
}

func startFenced(t *testing.T, s relay.Sink, state []byte, f *testFence) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx, relay.Session{State: state, Fence: f.Fence}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
}

// produceCounter counts the Produce requests the cluster receives (they
// name topics by id, so all are counted: the tests produce to one topic).
type produceCounter struct {
	mu    sync.Mutex
	count int
}

// heldProduce is a Produce request the cluster holds until release is
// closed, then answers with an error code for every partition.
type heldProduce struct {
	produces                produceCounter
	picked                  bool
	held, release, answered chan struct{}
}

// holdProduce makes the cluster hold the first Produce request that pick
// chooses, and count them all.
func holdProduce(kf *kfake.Cluster, pick func(*kmsg.ProduceRequest) bool, code int16) *heldProduce {
	h := &heldProduce{held: make(chan struct{}), release: make(chan struct{}), answered: make(chan struct{})}
	kf.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		kf.KeepControl()
		h.produces.mu.Lock()
		h.produces.count++
		hold := !h.picked && pick(req)
		h.picked = h.picked || hold
		h.produces.mu.Unlock()
		if !hold {
			return nil, nil, false
		}
		close(h.held)
		kf.SleepControl(func() { <-h.release })
		defer close(h.answered)
		return answerAll(req, code), nil, true
	})
	return h
}

func (p *produceCounter) n() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// answerAll answers req with code for every partition. NOT_LEADER_FOR_PARTITION
// is retriable: a client that may still produce retries it. INVALID_RECORD
// is not: the client would produce the partitions' later records under a
// bumped epoch.
func answerAll(req *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	for _, tp := range req.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
		for _, p := range tp.Partitions {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.Partition = p.Partition
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// startHeldFenced starts a cluster that holds every produce request
// (answered, once released, with NOT_LEADER_FOR_PARTITION) and a sink on
// it behind fence, untripped.
func startHeldFenced(t *testing.T) (c *kafkatest.Cluster, h *heldProduce, s *kafka.Sink, fence *testFence) {
	c = kafkatest.Start(t)
	h = holdProduce(c.Kfake(), func(*kmsg.ProduceRequest) bool { return true }, kerr.NotLeaderForPartition.Code)
	fence = &testFence{}
	s = newSink(t, c.Addrs(), nil)
	startFenced(t, s, nil, fence)
	return c, h, s, fence
}

// TestFenceAbandonsInFlight: the cluster holds the sink's first produce
// request; the fence fails; Publish returns ErrNotLeader without waiting
// for it. The held request is then answered with a retriable error: the
// client, which would otherwise retry it, sends no produce request again,
// and none of the records is in the log.
func TestFenceAbandonsInFlight(t *testing.T) {
	t.Parallel()
	c, h, s, fence := startHeldFenced(t)
	published := make(chan error, 1)
	go func() {
		_, err := s.Publish(context.Background(), relaytest.Messages("orders", 0, 50, 4))
		published <- err
	}()
	<-h.held
	fence.tripped.Store(true)
	if err := <-published; !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("Publish after the fence failed: %v, want ErrNotLeader", err)
	}
	close(h.release)
	<-h.answered
	// Once closed the client sends nothing: the count is final.
	s.Close(context.Background())
	if n := h.produces.n(); n != 1 {
		t.Errorf("%d produce requests reached the cluster, want only the one held before the fence failed", n)
	}
	if records := kafkatest.Read(t, c.Addrs(), "orders", false); len(records) != 0 {
		t.Errorf("%d records in the log after the fence failed", len(records))
	}
}

// TestFencedBeforePublish: with the fence failed, Publish hands nothing to
// the client and fails with ErrNotLeader; no produce request is sent.
func TestFencedBeforePublish(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	kf := c.Kfake()
	var produces produceCounter
	kf.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		produces.mu.Lock()
		produces.count++
		produces.mu.Unlock()
		return nil, nil, false
	})
	for _, txn := range []bool{false, true} {
		var fence testFence
		s := newSink(t, c.Addrs(), nil)
		if txn {
			s = newSink(t, c.Addrs(), transactional("fenced-before"))
		}
		startFenced(t, s, nil, &fence)
		before := produces.n()
		fence.tripped.Store(true)
		if _, err := s.Publish(context.Background(), relaytest.Messages("orders", 0, 10, 2)); !errors.Is(err, relay.ErrNotLeader) {
			t.Fatalf("transactional=%v: Publish with the fence failed: %v, want ErrNotLeader", txn, err)
		}
		if err := s.Ready(context.Background()); err == nil {
			t.Errorf("transactional=%v: Ready after the fence failed", txn)
		}
		s.Close(context.Background())
		if n := produces.n() - before; n != 0 {
			t.Errorf("transactional=%v: %d produce requests after the fence failed", txn, n)
		}
	}
	if records := kafkatest.Read(t, c.Addrs(), "orders", false); len(records) != 0 {
		t.Errorf("%d records in the log", len(records))
	}
}

// TestDeposedLeaderDoesNotCommit: the fence fails while the transaction's
// records are being acknowledged. The deposed sink sends no EndTxn commit;
// the next leader's Start aborts its transaction, and a read_committed
// reader sees none of its records, and every record of the next leader.
func TestDeposedLeaderDoesNotCommit(t *testing.T) {
	t.Parallel()
	const id = "deposed"
	c := kafkatest.Start(t)
	kf := c.Kfake()
	var (
		armed   atomic.Bool
		commits atomic.Int32
		fence   testFence
	)
	kf.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		req := kreq.(*kmsg.ProduceRequest)
		if armed.Load() && req.TransactionID != nil && *req.TransactionID == id {
			fence.tripped.Store(true)
		}
		return nil, nil, false
	})
	kf.ControlKey(int16(kmsg.EndTxn), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		if r := kreq.(*kmsg.EndTxnRequest); armed.Load() && r.Commit && r.TransactionalID == id {
			commits.Add(1)
		}
		return nil, nil, false
	})

	old := newSink(t, c.Addrs(), transactional(id))
	startFenced(t, old, nil, &fence)
	saved := publish(t, old, relaytest.Messages("orders", 0, 10, 3)).State
	armed.Store(true)
	if _, err := old.Publish(context.Background(), relaytest.Messages("orders", 10, 10, 3)); !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("the deposed sink's Publish: %v, want ErrNotLeader", err)
	}
	if n := commits.Load(); n != 0 {
		t.Fatalf("the deposed sink sent %d EndTxn commits", n)
	}
	armed.Store(false)

	cur := newSink(t, c.Addrs(), transactional(id))
	start(t, cur, saved)
	publish(t, cur, relaytest.Messages("orders", 10, 10, 3))
	old.Close(context.Background())
	cur.Close(context.Background())
	seen := map[string]int{}
	for _, r := range kafkatest.Read(t, c.Addrs(), "orders", true) {
		seen[string(r.Value)]++
	}
	for i := range 20 {
		if n := seen[fmt.Sprintf("orders-%d", i)]; n != 1 {
			t.Errorf("orders-%d read %d times, want once", i, n)
		}
	}
}

// withReplay is m republished by replay request req.
func withReplay(m relay.Message, req string) relay.Message {
	m.Headers = append(append([]relay.Header(nil), m.Headers...), relay.Header{Key: relay.HeaderReplay, Value: []byte(req)})
	return m
}

// TestRecoveryByIdentity: a transaction commits in Kafka but its
// acknowledgement never reaches Postgres. The next session re-delivers its
// events in another order, with a replay of one of them ahead of the
// original and a new event among them: the originals are skipped, the
// replay and the new event are published, each once.
func TestRecoveryByIdentity(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	first := newSink(t, c.Addrs(), transactional("identity"))
	start(t, first, nil)
	msgs := relaytest.Messages("orders", 0, 9, 3)
	saved := publish(t, first, msgs[:5]).State
	publish(t, first, msgs[5:8]) // committed, never acknowledged
	first.Close(context.Background())

	next := newSink(t, c.Addrs(), transactional("identity"))
	start(t, next, saved)
	redelivered := []relay.Message{withReplay(msgs[6], "9"), msgs[7], msgs[8], msgs[5], msgs[6]}
	publish(t, next, redelivered)
	next.Close(context.Background())

	type pub struct{ value, replay string }
	seen := map[pub]int{}
	for _, r := range kafkatest.Read(t, c.Addrs(), "orders", true) {
		p := pub{value: string(r.Value)}
		for _, h := range r.Headers {
			if h.Key == relay.HeaderReplay {
				p.replay = string(h.Value)
			}
		}
		seen[p]++
	}
	want := map[pub]int{{value: "orders-6", replay: "9"}: 1}
	for i := range 9 {
		want[pub{value: fmt.Sprintf("orders-%d", i)}] = 1
	}
	for p, n := range want {
		if seen[p] != n {
			t.Errorf("%v read %d times, want %d", p, seen[p], n)
		}
	}
	if len(seen) != len(want) {
		t.Errorf("read %v, want %v", seen, want)
	}
}

// countdownFence passes its first left checks once armed, then fails.
type countdownFence struct {
	armed atomic.Bool
	left  atomic.Int64
}

func (f *countdownFence) Fence() error {
	if !f.armed.Load() || f.left.Add(-1) >= 0 {
		return nil
	}
	return fmt.Errorf("%w: the test's countdown ran out", relay.ErrNotLeader)
}

// TestFenceCheckedAtTheWrite: the fence passes when Publish hands the
// records to the client and fails right after, before the client writes
// its produce request (it lingers a moment to fill batches). The request is
// never written: no produce request reaches the cluster, and the log holds
// none of the records.
func TestFenceCheckedAtTheWrite(t *testing.T) {
	t.Parallel()
	c := kafkatest.Start(t)
	kf := c.Kfake()
	var produces produceCounter
	kf.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.KeepControl()
		produces.mu.Lock()
		produces.count++
		produces.mu.Unlock()
		return nil, nil, false
	})
	var fence countdownFence
	s := newSink(t, c.Addrs(), func(cfg *kafka.Config) { cfg.Linger = time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.Start(ctx, relay.Session{Fence: fence.Fence}); err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	// The topic exists and its metadata is known, so that the next
	// Publish only produces.
	if _, err := s.Publish(ctx, relaytest.Messages("orders", 0, 1, 1)); err != nil {
		t.Fatal(err)
	}
	before := produces.n()
	fence.left.Store(1)
	fence.armed.Store(true)
	if _, err := s.Publish(ctx, relaytest.Messages("orders", 1, 50, 4)); !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("Publish with the fence failing after the hand-over: %v, want ErrNotLeader", err)
	}
	s.Close(context.Background())
	if n := produces.n() - before; n != 0 {
		t.Errorf("%d produce requests reached the cluster after the fence failed", n)
	}
	if records := kafkatest.Read(t, c.Addrs(), "orders", false); len(records) != 1 {
		t.Errorf("%d records in the log, want only the one published before", len(records))
	}
}
