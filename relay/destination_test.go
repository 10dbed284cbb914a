package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
)

// gateSink refuses every batch naming topic with a DestinationError until
// opened, and keeps what it published.
type gateSink struct {
	topic string

	mu       sync.Mutex
	open     bool
	refused  int
	sessions int
	got      []Message
}

func (s *gateSink) Start(context.Context, Session) error {
	s.mu.Lock()
	s.sessions++
	s.mu.Unlock()
	return nil
}

func (s *gateSink) Publish(_ context.Context, msgs []Message) (PublishResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if m.Topic == s.topic && !s.open {
			s.refused++
			return PublishResult{}, &DestinationError{Topic: s.topic, Reason: WaitTopicMissing, Err: fmt.Errorf("topic %s does not exist", s.topic)}
		}
	}
	s.got = append(s.got, msgs...)
	return PublishResult{}, nil
}

func (s *gateSink) Ready(context.Context) error { return nil }
func (s *gateSink) Close(context.Context) error { return nil }

// TestDestinationWait runs the real pipeline with a sink that refuses a
// topic: the refused batch is offered again (no pipeline restart, nothing
// dead-lettered), readiness fails naming the topic, the metric has its
// sample; a graceful stop during the wait returns and leaves the rows in
// the outbox; a new relay publishes everything, in order, once the topic
// is accepted, and clears the readiness reason and the sample.
func TestDestinationWait(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	const n = 120
	rows, err := conn.Query(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT CASE WHEN g > 40 THEN 'missing' ELSE 'present' END, 'k' || (g % 3), convert_to('e' || g, 'UTF8')
FROM generate_series(1, $1) AS g
RETURNING id AS "ID", event_id::text AS "EventID", topic AS "Topic", convert_to(key, 'UTF8') AS "Key", payload AS "Payload", created_at AS "CreatedAt"`, n)
	if err != nil {
		t.Fatal(err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByNameLax[Event])
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		events[i].Position = Position{Major: 1, Minor: uint64(events[i].ID)}
	}
	sink := &gateSink{topic: "missing"}
	run := func() (*Relay, context.CancelFunc, <-chan error) {
		// The heartbeat is off: the test's source never reads its rows.
		return runRelay(t, ctx, Config{DatabaseURL: url, BatchSize: 10, Lease: time.Second, ShutdownTimeout: time.Hour, ReadyTimeout: -1,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, &tableSource{events: events}, sink)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testwait.For(t, time.Minute, what, cond)
	}
	r, stop, done := run()
	waitFor("three offers of the refused batch", func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.refused >= 3
	})
	err = r.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "topic missing") {
		t.Fatalf("Ready while the topic is refused: %v", err)
	}
	if got := waitingSamples(t, r); got != 1 {
		t.Fatalf("%d waiting samples, want 1", got)
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a graceful stop during the wait: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a graceful stop did not end the wait")
	}
	var left, dead int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.events WHERE topic = 'missing'), (SELECT count(*) FROM outbox.dead_letters)`).Scan(&left, &dead); err != nil {
		t.Fatal(err)
	}
	if left != n-40 || dead != 0 {
		t.Fatalf("after the stop: %d rows of the refused topic in the outbox (want %d), %d dead letters", left, n-40, dead)
	}
	sink.mu.Lock()
	sessions := sink.sessions
	sink.open = true
	sink.mu.Unlock()
	if sessions != 1 {
		t.Fatalf("%d sink sessions: the wait restarted the pipeline", sessions)
	}

	r, stop, done = run()
	waitFor("the outbox drained", func() bool {
		var left int
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox.events").Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
	if err := r.Ready(ctx); err != nil {
		t.Errorf("Ready once the topic is accepted: %v", err)
	}
	if got := waitingSamples(t, r); got != 0 {
		t.Errorf("%d waiting samples once the topic is accepted", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	var order []string
	for _, m := range sink.got {
		order = append(order, string(m.Value))
	}
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("e%d", i+1)
	}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("published %v, want each event once in order", order)
	}
}

// waitingSamples counts r's relay_destination_waiting_since_timestamp_seconds
// samples.
func waitingSamples(t *testing.T, r *Relay) int {
	t.Helper()
	families, err := r.m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "relay_destination_waiting_since_timestamp_seconds" {
			return len(f.GetMetric())
		}
	}
	return 0
}
