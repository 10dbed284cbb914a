package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
)

// pgAwayFor is how long TestListenerServesWhilePostgresIsAway keeps
// PostgreSQL out of the relay's reach.
const pgAwayFor = 30 * time.Second

// TestListenerServesWhilePostgresIsAway: the relay's only way to
// PostgreSQL goes silent for 30 s (a blackhole: connections hang, new ones
// too), so its lease runs out and its pipeline stops. A consumer group
// member that reads the log slowly keeps fetching and committing through
// the Kafka listener the whole time, every commit accepted, and after
// PostgreSQL comes back the relay publishes the rest: every committed
// event exactly once, in per-key order.
func TestListenerServesWhilePostgresIsAway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	n, kafkaAddr, ledger := e.listenerWithEvents(3000)

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr), kgo.ConsumerGroup("slow-readers"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.FetchMaxBytes(16<<10), kgo.FetchMaxPartitionBytes(4<<10),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	read := 0
	// poll reads what one fetch returns and commits it; it fails the test
	// on any error from the listener.
	poll := func(what string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fs := cl.PollRecords(ctx, 40)
		if err := fs.Err0(); err != nil && ctx.Err() == nil {
			t.Fatalf("%s: fetch: %v", what, err)
		}
		recs := fs.Records()
		if len(recs) > 0 {
			if err := cl.CommitRecords(ctx, recs...); err != nil {
				t.Fatalf("%s: commit: %v", what, err)
			}
		}
		read += len(recs)
		return len(recs)
	}
	for read < 200 {
		poll("before the outage")
	}

	n.proxy.Blackhole()
	awayAt := time.Now()
	e2e.WaitReady(t, n.proc, false, 20*time.Second)
	t.Logf("the relay reported not ready %v after PostgreSQL went away", time.Since(awayAt).Round(time.Millisecond))
	// The service keeps writing meanwhile (straight to PostgreSQL, which
	// only the relay cannot reach).
	written := e2e.WriteAsync(context.Background(), e.writers(1000), ledger)
	before, polls, withRecords := read, 0, 0
	for time.Since(awayAt) < pgAwayFor {
		polls++
		if poll("while PostgreSQL is away") > 0 {
			withRecords++
		}
		time.Sleep(500 * time.Millisecond) // deliberate pause: samples the broker twice a second while PostgreSQL is away
	}
	if ready, _ := n.proc.Ready(); ready {
		t.Fatal("the relay reported ready at the end of the outage: PostgreSQL was not away")
	}
	committed, err := committedOffsets(context.Background(), cl, "slow-readers", "")
	if err != nil {
		t.Fatalf("fetching the group's offsets at the end of the outage: %v", err)
	}
	n.proxy.Heal()
	if read-before == 0 || withRecords < polls/2 {
		t.Fatalf("while PostgreSQL was away the consumer read %d records in %d of %d polls", read-before, withRecords, polls)
	}
	if committed < int64(read) {
		t.Fatalf("the group's committed offsets add up to %d, below the %d records read and committed", committed, read)
	}

	if err := <-written; err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	n.stop()
	got := e.checkAll(ledger)
	t.Logf("while PostgreSQL was away for %v: %d records read and committed in %d of %d polls; then %d events in the log exactly once",
		pgAwayFor, read-before, withRecords, polls, got)
}
