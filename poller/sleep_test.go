package poller_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

// TestSleepingReaderMissesNoCommit runs a reader whose poll interval is an
// hour, so that only the sleep lock and NOTIFY can wake it, through 300
// rounds: in each, one to four writers commit events back to back for up
// to 15 ms (the reader, finding rows, reads on without the lock), then one
// more each at random moments within 3 ms (around its taking the lock
// again), and every event of the round must be delivered before the next
// begins. A commit that neither notified nor was read after the lock was
// taken waits an hour, so the round times out. Every event is delivered
// exactly once.
func TestSleepingReaderMissesNoCommit(t *testing.T) {
	url, conn := modeDatabase(t, "row-id")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := started(t, ctx, poller.Config{DatabaseURL: url, PollInterval: time.Hour}, relay.Position{})

	const writers, rounds = 4, 300
	var mu sync.Mutex
	seen := map[string]int{}
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	readDone := make(chan error, 1)
	go func() {
		for {
			events, err := p.Next(rctx, 500)
			if err != nil {
				readDone <- err
				return
			}
			mu.Lock()
			for _, e := range events {
				seen[string(e.Payload)]++
			}
			mu.Unlock()
		}
	}()
	delivered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}

	conns := make([]*pgx.Conn, writers)
	for i := range conns {
		conns[i] = pgtest.Connect(t, url)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	written := 0
	// The reader's lock, sampled: it must be seen both held and released.
	var held, released atomic.Int64
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sctx.Err() == nil {
			var n int
			if conn.QueryRow(sctx, `SELECT count(*) FROM pg_locks WHERE `+sleepLockHeld).Scan(&n) == nil {
				if n > 0 {
					held.Add(1)
				} else {
					released.Add(1)
				}
			}
			time.Sleep(time.Millisecond) // condition poll: samples the reader's sleep state in a loop
		}
	}()
	for round := range rounds {
		// A burst, during which the reader finds rows and reads on
		// without the lock; then the round's last commits, around its
		// taking the lock again.
		burst := time.Duration(rnd.IntN(15)) * time.Millisecond
		n := 1 + rnd.IntN(writers)
		g, gctx := errgroup.WithContext(ctx)
		var burstEvents atomic.Int64
		for w := range n {
			delay := time.Duration(rnd.IntN(3000)) * time.Microsecond
			g.Go(func() error {
				insert := func(payload string) error {
					_, err := conns[w].Exec(gctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', $1, $2)`,
						fmt.Sprint(w), []byte(payload))
					return err
				}
				for end, i := time.Now().Add(burst), 0; time.Now().Before(end); i++ {
					if err := insert(fmt.Sprintf("%d-%d-%d", round, w, i)); err != nil {
						return err
					}
					burstEvents.Add(1)
				}
				time.Sleep(delay) // deliberate pause: the quiet gap after a burst that the reader must sleep through
				return insert(fmt.Sprintf("%d-%d", round, w))
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		written += n + int(burstEvents.Load())
		deadline := time.Now().Add(10 * time.Second)
		for delivered() < written {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d of %d events delivered 10 s after their commits, with an hour's poll interval: a commit was missed", round, delivered(), written)
			}
			select {
			case err := <-readDone:
				t.Fatalf("Next: %v", err)
			case <-time.After(200 * time.Microsecond):
			}
		}
	}
	stopReading()
	<-readDone
	stopSampling()
	<-sampled
	if held.Load() == 0 || released.Load() == 0 {
		t.Errorf("the sleep lock was seen held %d times and released %d: the rounds did not take the reader through both", held.Load(), released.Load())
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("event %s delivered %d times", k, c)
		}
	}
}

// sleepLockHeld picks the reader's sleep lock out of pg_locks, which lists
// the whole cluster's (shared by every package's tests when
// RELAY_TEST_DATABASE_URL is set): the only advisory lock held
// exclusively in the test's own database.
const sleepLockHeld = `locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// TestSleepingReaderSessionEnds terminates the reader's session while it
// sleeps, which releases the sleep lock without the reader knowing: the
// next commit does not notify. Next must fail by the poll interval (when
// it releases the lock on the dead connection), and a restart delivers
// the event.
func TestSleepingReaderSessionEnds(t *testing.T) {
	url, conn := modeDatabase(t, "row-id")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := started(t, ctx, poller.Config{DatabaseURL: url, PollInterval: 2 * time.Second}, relay.Position{})
	type result struct {
		events []relay.Event
		err    error
	}
	next := make(chan result, 1)
	go func() {
		events, err := p.Next(ctx, 10)
		next <- result{events, err}
	}()
	var pid int32
	testwait.Until(t, 30*time.Second, "the reader's backend to go to sleep", func() error {
		err := conn.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE `+sleepLockHeld).Scan(&pid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		if pid == 0 {
			return errors.New("no backend holds the sleep lock")
		}
		return nil
	})
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', 'k', 'after')`); err != nil {
		t.Fatal(err)
	}
	r := <-next
	if r.err == nil {
		t.Fatalf("Next returned %d events and no error after its session ended", len(r.events))
	}
	if err := p.Start(ctx, relay.Position{}); err != nil {
		t.Fatal(err)
	}
	events, err := p.Next(ctx, 10)
	if err != nil || len(events) != 1 || string(events[0].Payload) != "after" {
		t.Fatalf("after a restart: %d events, %v; want the one written while the session was gone", len(events), err)
	}
}
