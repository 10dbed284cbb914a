package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxrelay/relay/internal/pgtest"
)

// asyncSink is a PipelinedSink whose batches become durable in an order of
// its own choosing (shuffled, after a random delay), while the core must
// still wait for them in order. It fails the waits of the batches named in
// failAt (counted over all sessions), and records what became durable.
type asyncSink struct {
	rng    *rand.Rand
	failAt map[int]bool

	mu          sync.Mutex
	batches     int
	outstanding int
	maxOut      int
	sessions    int
	failures    int
	published   [][]Message
	durable     map[string]bool // event ids whose batch's wait returned nil
	durableNext int             // count of waits that returned nil
	pending     []chan struct{}
}

func (s *asyncSink) Start(context.Context, Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sessions++
	// The previous session's waits that the core never called are
	// abandoned with it.
	s.outstanding = 0
	return nil
}

func (s *asyncSink) Publish(ctx context.Context, msgs []Message) (PublishResult, error) {
	wait, err := s.PublishAsync(ctx, msgs)
	if err != nil {
		return PublishResult{}, err
	}
	return wait()
}

func (s *asyncSink) PublishAsync(_ context.Context, msgs []Message) (func() (PublishResult, error), error) {
	s.mu.Lock()
	s.batches++
	k := s.batches
	s.outstanding++
	s.maxOut = max(s.maxOut, s.outstanding)
	done := make(chan struct{})
	s.pending = append(s.pending, done)
	// Complete a random pending batch after a short delay: later batches
	// often become durable before earlier ones.
	pick := s.pending[s.rng.IntN(len(s.pending))]
	delay := time.Duration(s.rng.IntN(3000)) * time.Microsecond
	s.mu.Unlock()
	time.AfterFunc(delay, func() { s.complete(pick) })
	msgs = append([]Message(nil), msgs...)
	return func() (PublishResult, error) {
		select {
		case <-done:
		case <-time.After(20 * time.Millisecond):
			// Nothing completed it by chance: it becomes durable now.
			s.complete(done)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.outstanding--
		if s.failAt[k] {
			s.failures++
			return PublishResult{}, fmt.Errorf("injected failure of batch %d", k)
		}
		for _, m := range msgs {
			s.durable[string(m.EventID())] = true
		}
		s.durableNext++
		s.published = append(s.published, msgs)
		return PublishResult{State: fmt.Appendf(nil, "state %d", k)}, nil
	}, nil
}

func (s *asyncSink) complete(done chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.pending {
		if p == done {
			close(p)
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			return
		}
	}
}

func (s *asyncSink) Ready(context.Context) error { return nil }
func (s *asyncSink) Close(context.Context) error { return nil }

func (s *asyncSink) isDurable(eventID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.durable[eventID]
}

// ackingSource is a tableSource that checks, at every acknowledgement the
// core confirms, that each event up to it was made durable by the sink.
type ackingSource struct {
	tableSource
	sink  *asyncSink
	mu    sync.Mutex
	acks  int
	early error
}

func (s *ackingSource) Acked(ctx context.Context, through Position) error {
	s.mu.Lock()
	s.acks++
	for _, e := range s.events {
		if !through.Less(e.Position) && !s.sink.isDurable(e.EventID) && s.early == nil {
			s.early = fmt.Errorf("acknowledged through %v before event %d was durable", through, e.ID)
		}
	}
	s.mu.Unlock()
	return s.tableSource.Acked(ctx, through)
}

// TestPipelineStages runs the real pipeline over real Postgres with a
// source of table rows and a pipelined sink whose batches become durable
// out of order, and checks what the stages promise each other:
//   - batching: no batch above BatchSize events or BatchBytes bytes;
//   - pipelining: more than one batch outstanding, never more than
//     maxInFlight;
//   - durability before deletion: a row leaves the outbox (checked while
//     the pipeline runs) and an acknowledgement reaches the source only
//     after the sink's wait for its batch returned;
//   - ack merging: fewer acknowledgement transactions than batches, and the
//     checkpoint holds the last batch's position and sink state;
//   - ordering: without failures, the sink got every event once, in the
//     source's order; with failed waits (each a restart), every event at
//     least once and each restart resumed from the checkpoint.
func TestPipelineStages(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failAt map[int]bool
	}{
		{"clean", nil},
		{"failed waits", map[int]bool{5: true, 17: true, 18: true, 40: true}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPipelineStages(t, tc.failAt) })
	}
}

func testPipelineStages(t *testing.T, failAt map[int]bool) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	const (
		n          = 600
		batchSize  = 40
		batchBytes = 4096
	)
	sink := &asyncSink{rng: rand.New(rand.NewPCG(1, 2)), failAt: failAt, durable: map[string]bool{}}
	src := &ackingSource{sink: sink, tableSource: tableSource{events: insertOrders(t, conn, `SELECT 'orders', 'k' || (g % 10), convert_to(rpad('e' || g, 300, '.'), 'UTF8') FROM generate_series(1, $1) AS g`, n)}}
	byRow := map[int64]string{}
	for _, e := range src.events {
		byRow[e.ID] = e.EventID
	}
	src.chunk = batchSize

	r, stop, done := runRelay(t, ctx, Config{DatabaseURL: url, BatchSize: batchSize, BatchBytes: batchBytes, AckInterval: 30 * time.Millisecond,
		Lease: time.Second, ReadyTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, src, sink)

	// While the pipeline runs: every row gone from the outbox is durable.
	awaitDrained(t, conn, 2*time.Minute, func(left map[int64]bool) {
		for id, eventID := range byRow {
			if !left[id] && !sink.isDurable(eventID) {
				t.Fatalf("row %d left the outbox before its batch was durable", id)
			}
		}
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if src.early != nil {
		t.Fatal(src.early)
	}
	if src.overlap != nil {
		t.Fatal(src.overlap)
	}

	sink.mu.Lock()
	defer sink.mu.Unlock()
	maxEvent := eventBytes(src.events[0])
	for i, b := range sink.published {
		if len(b) > batchSize || int64(len(b))*maxEvent > batchBytes {
			t.Errorf("batch %d has %d events of %d bytes: above %d events or %d bytes", i, len(b), maxEvent, batchSize, batchBytes)
		}
	}
	if sink.maxOut < 2 || sink.maxOut > maxInFlight {
		t.Errorf("at most %d batches were outstanding, want 2 to %d", sink.maxOut, maxInFlight)
	}
	if src.acks >= sink.durableNext {
		t.Errorf("%d acknowledgement transactions for %d durable batches: none merged", src.acks, sink.durableNext)
	}
	var major, minor int64
	var state []byte
	if err := conn.QueryRow(ctx, `SELECT position_major, position_minor, sink_state FROM outbox.checkpoints WHERE name = 'default'`).Scan(&major, &minor, &state); err != nil {
		t.Fatal(err)
	}
	last := src.events[len(src.events)-1].Position
	if uint64(major) != last.Major || uint64(minor) != last.Minor {
		t.Errorf("checkpoint at (%d, %d), want the last event's %v", major, minor, last)
	}
	if want := fmt.Sprintf("state %d", sink.batches); string(state) != want && failAt == nil {
		t.Errorf("checkpoint holds sink state %q, want the last batch's %q", state, want)
	}

	var got []string
	for _, b := range sink.published {
		for _, m := range b {
			got = append(got, string(m.EventID()))
		}
	}
	if failAt == nil {
		if len(got) != n {
			t.Fatalf("%d events published, want %d once each", len(got), n)
		}
		var read, published dto.Metric
		if err := r.m.ReadLatency.Write(&read); err != nil {
			t.Fatal(err)
		}
		if err := r.m.Latency.Write(&published); err != nil {
			t.Fatal(err)
		}
		rh, ph := read.GetHistogram(), published.GetHistogram()
		if rh.GetSampleCount() != n || ph.GetSampleCount() != n {
			t.Errorf("read latency counted %d events and publish latency %d, want %d each", rh.GetSampleCount(), ph.GetSampleCount(), n)
		}
		if rh.GetSampleSum() > ph.GetSampleSum() {
			t.Errorf("read latencies sum to %.3f s, above the publish latencies' %.3f s: reading cannot take longer than publishing", rh.GetSampleSum(), ph.GetSampleSum())
		}
		for i, e := range src.events {
			if got[i] != e.EventID {
				t.Fatalf("event %d published at place %d: out of source order", e.ID, i)
			}
		}
		return
	}
	// A batch named in failAt may be abandoned with its session before
	// its wait is called; those that failed each restarted the pipeline.
	if sink.failures < 2 || sink.sessions != 1+sink.failures {
		t.Errorf("%d sink sessions for %d injected failures, want one per failure and the first", sink.sessions, sink.failures)
	}
	if src.starts != sink.sessions {
		t.Errorf("%d source starts for %d sink sessions", src.starts, sink.sessions)
	}
	seen := map[string]bool{}
	for _, id := range got {
		seen[id] = true
	}
	for _, e := range src.events {
		if !seen[e.EventID] {
			t.Errorf("event %d never became durable", e.ID)
		}
	}
	t.Logf("%d batches, %d durable, %d acknowledgements, %d sessions, %d messages for %d events",
		sink.batches, sink.durableNext, src.acks, sink.sessions, len(got), n)
}

// awaitDrained polls the outbox until it is empty, failing t after
// timeout; each, when not nil, sees the ids left at every poll.
func awaitDrained(t *testing.T, conn *pgx.Conn, timeout time.Duration, each func(left map[int64]bool)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left, err := remainingRows(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		if each != nil {
			each(left)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left in the outbox", len(left))
		}
		time.Sleep(2 * time.Millisecond) // condition poll
	}
}

func remainingRows(ctx context.Context, conn *pgx.Conn) (map[int64]bool, error) {
	rows, err := conn.Query(ctx, `SELECT id FROM outbox.events`)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	left := make(map[int64]bool, len(ids))
	for _, id := range ids {
		left[id] = true
	}
	return left, nil
}
