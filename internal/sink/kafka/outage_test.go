package kafka_test

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// core plays the relay core against one sink: it publishes an outbox in
// batches of random sizes, acknowledges each batch only some batches
// later (the core pipelines), and on a Publish error, or at a simulated
// crash, restarts the sink from the last acknowledged state and
// re-delivers everything not acknowledged.
type core struct {
	t      *testing.T
	newFn  func() *kafka.Sink
	outbox []relay.Message
	rng    *rand.Rand

	sink    *kafka.Sink
	acked   int    // outbox[:acked] is acknowledged
	saved   []byte // the state saved with it
	errors  int
	crashes int
	zombies []*kafka.Sink
}

// newCore returns a core that publishes outbox through sinks on cl,
// transactional with txnID when it is set and adjusted by adjust when that
// is not nil, drawing its batch sizes from rng.
func newCore(t *testing.T, cl *kafkatest.Cluster, outbox []relay.Message, rng *rand.Rand, txnID string, adjust func(*kafka.Config)) *core {
	return &core{t: t, outbox: outbox, rng: rng, newFn: func() *kafka.Sink {
		return newSink(t, cl.Addrs(), func(cfg *kafka.Config) {
			cfg.TransactionalID = txnID
			if adjust != nil {
				adjust(cfg)
			}
		})
	}}
}

// checkOrders reads the topic orders back from cl and checks that it
// holds the outbox (check), with no duplicate in the transactional mode;
// it returns the number of duplicates.
func (c *core) checkOrders(cl *kafkatest.Cluster, txn bool) int {
	c.t.Helper()
	dups := check(c.t, kafkatest.Read(c.t, cl.Addrs(), "orders", txn), c.outbox)
	c.t.Logf("%d crashes, %d publish errors, %d duplicates", c.crashes, c.errors, dups)
	if txn && dups > 0 {
		c.t.Fatalf("%d duplicates in the transactional mode", dups)
	}
	return dups
}

type inflight struct {
	through int
	state   []byte
}

func (c *core) restart() {
	if c.sink != nil {
		c.sink.Close(context.Background())
	}
	for {
		s := c.newFn()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.Start(ctx, relay.Session{State: c.saved})
		cancel()
		if err == nil {
			c.sink = s
			return
		}
		time.Sleep(100 * time.Millisecond) // retry backoff: starting the sink again
	}
}

// run publishes the whole outbox; crashEvery > 0 abandons the sink
// (without closing it: it lingers as a zombie) and loses the pending
// acknowledgements every so many batches.
func (c *core) run(crashEvery int, during func(batch int)) {
	c.restart()
	var pending []inflight
	next := c.acked
	for batch := 1; c.acked < len(c.outbox); batch++ {
		if during != nil {
			during(batch)
		}
		if next < len(c.outbox) {
			n := min(1+c.rng.IntN(60), len(c.outbox)-next)
			res, err := c.sink.Publish(context.Background(), c.outbox[next:next+n])
			if err != nil {
				c.errors++
				pending, next = nil, c.acked
				time.Sleep(50 * time.Millisecond) // retry backoff: before the restart after a failed publish
				c.restart()
				continue
			}
			if len(res.Failed) > 0 {
				c.t.Fatalf("refused: %v", res.Failed)
			}
			state := res.State
			if state == nil && len(pending) > 0 {
				state = pending[len(pending)-1].state
			} else if state == nil {
				state = c.saved
			}
			next += n
			pending = append(pending, inflight{next, state})
		}
		if crashEvery > 0 && batch%crashEvery == 0 {
			c.crashes++
			c.zombies = append(c.zombies, c.sink)
			c.sink = nil
			pending, next = nil, c.acked
			c.restart()
			continue
		}
		// Acknowledge all but the newest two batches (all at the end).
		for len(pending) > 2 || (next == len(c.outbox) && len(pending) > 0) {
			c.acked, c.saved = pending[0].through, pending[0].state
			pending = pending[1:]
		}
	}
	c.sink.Close(context.Background())
	for _, z := range c.zombies {
		z.Close(context.Background())
	}
}

// check reads the topic back: every message present, per-key order of
// first copies kept; it returns the number of duplicates.
func check(t *testing.T, records []relaytest.Record, outbox []relay.Message) int {
	t.Helper()
	count := map[string]int{}
	for _, r := range records {
		count[string(r.Value)]++
	}
	dups := 0
	var missing []string
	for _, m := range outbox {
		n := count[string(m.Value)]
		if n == 0 {
			missing = append(missing, string(m.Value))
		}
		dups += max(n-1, 0)
	}
	if len(missing) > 0 {
		byPart := map[int32]int{}
		for _, r := range records {
			byPart[r.Partition]++
		}
		t.Fatalf("%d of %d messages missing (%d records read, by partition %v): %v", len(missing), len(outbox), len(records), byPart, missing[:min(len(missing), 20)])
	}
	if len(records) != len(outbox)+dups {
		t.Fatalf("%d records, want %d plus %d duplicates", len(records), len(outbox), dups)
	}
	relaytest.CheckKeyOrder(t, records, "orders")
	return dups
}

// TestOutage stops the cluster for a few seconds while the core publishes
// and starts it again: Publish and Ready fail during the outage, and
// afterwards every event is in Kafka in per-key order; exactly once in the
// transactional mode.
func TestOutage(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		cl := kafkatest.Start(t)
		c := newCore(t, cl, relaytest.Messages("orders", 0, 3000, 23), rand.New(rand.NewPCG(3, 4)), transactionalID(txn, "outage"), func(cfg *kafka.Config) {
			cfg.PublishTimeout = 2 * time.Second
			cfg.DialTimeout = time.Second
			cfg.Logger = quiet
		})
		var notReady atomic.Int32
		c.run(0, func(batch int) {
			if batch != 20 {
				return
			}
			cl.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if c.sink.Ready(ctx) != nil {
				notReady.Add(1)
			}
			cancel()
			go func() {
				time.Sleep(3 * time.Second) // simulates a 3 s Kafka outage
				cl.Restart()
			}()
		})
		if notReady.Load() == 0 {
			t.Fatal("Ready passed during the outage")
		}
		if c.errors == 0 {
			t.Fatal("no Publish failed during the outage")
		}
		c.checkOrders(cl, txn)
	})
}

// TestCrashes abandons the sink (as kill -9 would, leaving its client as
// a zombie) every few batches, losing the acknowledgements in flight: the
// transactional mode publishes each event once, the other at least once.
func TestCrashes(t *testing.T) {
	eachMode(t, func(t *testing.T, txn bool) {
		cl := kafkatest.Start(t)
		c := newCore(t, cl, relaytest.Messages("orders", 0, 2000, 17), rand.New(rand.NewPCG(5, 6)), transactionalID(txn, "crashes"), nil)
		c.run(7, nil)
		if dups := c.checkOrders(cl, txn); !txn && dups == 0 {
			t.Fatal("no duplicates: the crashes lost no acknowledgement, the test proves nothing")
		}
	})
}
