package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
)

// tableSource is a Source over rows the test inserted: it delivers them in
// id order after the position it starts from, as the core expects, and
// checks that the core never runs it in two sessions at once.
type tableSource struct {
	events []Event
	// chunk is the most events a Next returns (default 7).
	chunk int
	// asked records the max of every Next.
	asked []int

	mu      sync.Mutex
	cursor  int
	started bool
	acked   Position
	inNext  atomic.Int32
	starts  int
	overlap error
}

func (s *tableSource) Start(_ context.Context, from Position) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.inNext.Load() != 0 {
		s.overlap = errors.New("Start while the previous session's source was still open or read")
	}
	s.started = true
	s.starts++
	s.cursor = 0
	for s.cursor < len(s.events) && !from.Less(s.events[s.cursor].Position) {
		s.cursor++
	}
	return nil
}

func (s *tableSource) Next(ctx context.Context, max int) ([]Event, error) {
	s.inNext.Add(1)
	defer s.inNext.Add(-1)
	s.mu.Lock()
	s.asked = append(s.asked, max)
	s.mu.Unlock()
	for {
		s.mu.Lock()
		if s.cursor < len(s.events) {
			chunk := s.chunk
			if chunk == 0 {
				chunk = 7
			}
			n := min(max, chunk, len(s.events)-s.cursor)
			out := append([]Event(nil), s.events[s.cursor:s.cursor+n]...)
			s.cursor += n
			s.mu.Unlock()
			return out, nil
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (s *tableSource) Acked(_ context.Context, through Position) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if through.Less(s.acked) {
		return fmt.Errorf("acknowledgement went back from %v to %v", s.acked, through)
	}
	s.acked = through
	return nil
}

func (s *tableSource) Close(context.Context) error {
	s.mu.Lock()
	s.started = false
	s.mu.Unlock()
	return nil
}

// flakySink keeps what it was given, fails the publishes the test names,
// and checks that no Publish of an old session overlaps a new one.
type flakySink struct {
	mu       sync.Mutex
	open     bool
	inFlight int
	calls    int
	failAt   map[int]bool
	got      []Message
	sessions int
	overlap  error
	fence    func() error
}

func (s *flakySink) Start(_ context.Context, sess Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open || s.inFlight != 0 {
		s.overlap = errors.New("Start while the previous session's sink was open or publishing")
	}
	s.open, s.fence = true, sess.CheckFence
	s.sessions++
	return nil
}

func (s *flakySink) Publish(ctx context.Context, msgs []Message) (PublishResult, error) {
	s.mu.Lock()
	s.calls++
	call, fail, open := s.calls, s.failAt[s.calls], s.open
	s.inFlight++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	if !open {
		return PublishResult{}, errors.New("Publish on a closed sink")
	}
	if err := s.fence(); err != nil {
		return PublishResult{}, err
	}
	// A little time in flight, so the stages overlap.
	time.Sleep(time.Millisecond) // deliberate pause: time in flight in the fake sink, so the stages overlap
	if fail {
		return PublishResult{}, fmt.Errorf("injected failure of publish %d", call)
	}
	s.mu.Lock()
	s.got = append(s.got, msgs...)
	s.mu.Unlock()
	return PublishResult{State: fmt.Appendf(nil, "%d", call)}, nil
}

func (s *flakySink) Ready(context.Context) error { return nil }

func (s *flakySink) Close(context.Context) error {
	s.mu.Lock()
	s.open = false
	s.mu.Unlock()
	return nil
}

// runRelay makes a relay of cfg over src and sink and runs it in the
// background until stop is called; done receives what Run returned.
func runRelay(t *testing.T, ctx context.Context, cfg Config, src Source, sink Sink) (r *Relay, stop context.CancelFunc, done <-chan error) {
	t.Helper()
	r, err := New(cfg, src, sink)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(runCtx) }()
	return r, stop, ran
}

// TestPipelineRestartsCleanly runs the real pipeline over real Postgres
// with a sink that fails several publishes: each failure ends the session,
// every stage of it (the sampler and pruner too) has returned before the
// next starts, events come back from the checkpoint, and in the end every
// row is published (at least once, as the sink cannot deduplicate) and
// moved from the outbox to the archive.
// Under -race this covers the restart path.
func TestPipelineRestartsCleanly(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	const n = 400
	src := &tableSource{events: insertOrders(t, conn, `SELECT 'orders', 'k' || (g % 5), convert_to('e' || g, 'UTF8') FROM generate_series(1, $1) AS g`, n)}
	sink := &flakySink{failAt: map[int]bool{3: true, 9: true, 10: true, 20: true}}
	_, stop, done := runRelay(t, ctx, Config{DatabaseURL: url, BatchSize: 50, BacklogInterval: 10 * time.Millisecond, Retain: time.Hour,
		PruneInterval: 10 * time.Millisecond, Lease: time.Second, ReadyTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, src, sink)
	drainThenStop(t, conn, 2*time.Minute, stop, done)
	if src.overlap != nil || sink.overlap != nil {
		t.Fatalf("sessions overlapped: %v %v", src.overlap, sink.overlap)
	}
	if sink.sessions < 4 {
		t.Fatalf("%d sink sessions; the 4 injected failures should each have restarted it", sink.sessions)
	}
	seen := map[string]int{}
	for _, m := range sink.got {
		seen[string(m.EventID())]++
	}
	for _, e := range src.events {
		if seen[e.EventID] == 0 {
			t.Errorf("event %d was never published", e.ID)
		}
	}
	var archived int
	if err := conn.QueryRow(ctx, "SELECT count(DISTINCT id) FROM outbox.events_archive").Scan(&archived); err != nil {
		t.Fatal(err)
	}
	if archived != n {
		t.Fatalf("%d rows archived, want %d", archived, n)
	}
	t.Logf("%d sessions, %d messages for %d events", sink.sessions, len(sink.got), n)
}

// drainThenStop waits until the outbox is empty (failing after within),
// then stops the relay and checks that Run returned cleanly.
func drainThenStop(t *testing.T, conn *pgx.Conn, within time.Duration, stop context.CancelFunc, done <-chan error) {
	t.Helper()
	testwait.Until(t, within, "the outbox to drain", func() error {
		var left int
		if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox.events").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left > 0 {
			return fmt.Errorf("%d rows left in the outbox", left)
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// insertOrders inserts the rows select (taking the count as $1) makes
// into the outbox and returns them as the events a source would deliver,
// in id order, on the topic "orders" with their row id as the position.
func insertOrders(t *testing.T, conn *pgx.Conn, selectRows string, n int) []Event {
	t.Helper()
	rows, err := conn.Query(context.Background(), `INSERT INTO outbox.events (topic, key, payload) `+selectRows+`
RETURNING id, event_id::text, key, payload, created_at`, n)
	if err != nil {
		t.Fatal(err)
	}
	var events []Event
	for rows.Next() {
		var e Event
		var key string
		if err := rows.Scan(&e.ID, &e.EventID, &key, &e.Payload, &e.CreatedAt); err != nil {
			t.Fatal(err)
		}
		e.Topic, e.Key, e.Position = "orders", []byte(key), Position{Major: 1, Minor: uint64(e.ID)}
		events = append(events, e)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	return events
}

// startWatchingSink is a flakySink whose Start waits until the source has
// been asked for a page since the last start, and fails its first
// failStarts starts after that.
type startWatchingSink struct {
	*flakySink
	src        *tableSource
	failStarts int

	starts int
	unread int // starts that saw no new read of the source
	asked  int // the source's Next calls when the last start returned
}

func (s *startWatchingSink) Start(ctx context.Context, sess Session) error {
	s.starts++
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.src.mu.Lock()
		asked := len(s.src.asked)
		s.src.mu.Unlock()
		if asked > s.asked {
			s.asked = asked
			break
		}
		if time.Now().After(deadline) {
			s.unread++
			break
		}
		time.Sleep(time.Millisecond) // condition poll
	}
	if s.starts <= s.failStarts {
		return fmt.Errorf("injected failure of sink start %d", s.starts)
	}
	return s.flakySink.Start(ctx, sess)
}

// The source reads its first page while the sink starts, and a sink that
// fails to start leaves no read behind: the next session's source starts
// only once the read-ahead ended (tableSource reports an overlap), and
// every event is published once the sink starts.
func TestSourceReadsWhileSinkStarts(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	const n = 120
	src := &tableSource{events: insertOrders(t, conn, `SELECT 'orders', 'k' || (g % 5), convert_to('e' || g, 'UTF8') FROM generate_series(1, $1) AS g`, n)}
	sink := &startWatchingSink{flakySink: &flakySink{}, src: src, failStarts: 2}
	_, stop, done := runRelay(t, ctx, Config{DatabaseURL: url, BatchSize: 50, BacklogInterval: 10 * time.Millisecond,
		Lease: time.Second, ReadyTimeout: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, src, sink)
	drainThenStop(t, conn, time.Minute, stop, done)
	if src.overlap != nil || sink.overlap != nil {
		t.Fatalf("sessions overlapped: %v %v", src.overlap, sink.overlap)
	}
	if sink.starts != 3 || sink.unread != 0 {
		t.Fatalf("%d sink starts, %d of them with no read of the source; want 3 and 0", sink.starts, sink.unread)
	}
	seen := map[string]int{}
	for _, m := range sink.got {
		seen[string(m.EventID())]++
	}
	for _, e := range src.events {
		if seen[e.EventID] != 1 {
			t.Errorf("event %d published %d times", e.ID, seen[e.EventID])
		}
	}
}
