package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

// readyz returns /readyz's status code and reason.
func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("/readyz: %v", err)
	}
	defer resp.Body.Close()
	var body struct {
		Reason string `json:"reason"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body.Reason
}

// lockFor blocks by holding lock in a transaction until released.
func lockFor(lock string) func(t *testing.T, admin *pgx.Conn) (release func()) {
	return func(t *testing.T, admin *pgx.Conn) func() {
		ctx := context.Background()
		tx, err := admin.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, lock); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// stopWALSender stalls the WAL reader's stream: SIGSTOP of the server
// process that sends the slot's changes (the tests run as root), SIGCONT
// to release.
func stopWALSender(slot string) func(t *testing.T, admin *pgx.Conn) (release func()) {
	return func(t *testing.T, admin *pgx.Conn) func() {
		var pid int
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) { // condition poll: the slot's walsender is a server process
			err := admin.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot).Scan(&pid)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the WAL sender of slot %s: %v", slot, err)
			}
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("stopping the WAL sender %d: %v", pid, err)
		}
		return func() {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatalf("resuming the WAL sender %d: %v", pid, err)
			}
		}
	}
}

type readinessBlock struct {
	what  string
	block func(t *testing.T, admin *pgx.Conn) (release func())
}

// TestReadinessFollowsTheHeartbeat runs the binary with --ready-timeout 2s
// and blocks, in turn, the reader (the poller by a lock on its tick table,
// the WAL reader by stopping the server process that streams to it) and
// the acknowledgement (a lock on the checkpoint table): /readyz must turn
// not ready, naming the heartbeat, with relay_heartbeat_age_seconds past
// the bound, and ready again once the block is gone.
func TestReadinessFollowsTheHeartbeat(t *testing.T) {
	ack := readinessBlock{"the acknowledgement", lockFor("LOCK TABLE outbox.checkpoints IN ACCESS EXCLUSIVE MODE")}
	for _, c := range []struct {
		source string
		blocks []readinessBlock
	}{
		{"poll", []readinessBlock{{"the reader", lockFor("LOCK TABLE outbox.poll_ticks IN ACCESS EXCLUSIVE MODE")}, ack}},
		{"cdc", []readinessBlock{{"the reader", stopWALSender("relay_ready_cdc")}, ack}},
	} {
		t.Run(c.source, func(t *testing.T) {
			ctx := context.Background()
			url, bin := e2e.Migrated(t)
			addr := e2e.FreeAddr(t)
			p := e2e.Start(t, bin, nil, runArgs(url, e2e.DataDir(t), addr, "--ready-timeout", "2s",
				"--source", c.source, "--slot", "relay_ready_"+c.source)...)
			e2e.WaitReady(t, p, true, 30*time.Second)
			admin := pgtest.Connect(t, url)
			for _, b := range c.blocks {
				var once sync.Once
				unblock := b.block(t, admin)
				release := func() { once.Do(unblock) }
				t.Cleanup(release) // also when the test fails while blocked
				e2e.WaitReady(t, p, false, 30*time.Second)
				code, reason := readyz(t, addr)
				if code != http.StatusServiceUnavailable || !strings.Contains(reason, "no heartbeat reached the log") {
					t.Fatalf("%s blocked: /readyz %d %q, want 503 naming the heartbeat", b.what, code, reason)
				}
				if age := e2e.Metric(t, addr, "relay_heartbeat_age_seconds"); age <= 2 {
					t.Fatalf("%s blocked: relay_heartbeat_age_seconds %v while not ready", b.what, age)
				}
				release()
				e2e.WaitReady(t, p, true, time.Minute)
				t.Logf("%s blocked: %q; ready again after the block was released", b.what, reason)
			}
			p.Stop(time.Minute)
			if c.source == "cdc" {
				if _, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot('relay_ready_cdc')"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// gateSink is a sink whose Publish hangs while its gate is shut, and which
// says it is ready all the while: a sink hung in a way only the heartbeat
// shows.
type gateSink struct {
	mu   sync.Mutex
	open chan struct{}
	got  []relay.Message
}

func (s *gateSink) gate() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

func (s *gateSink) Start(context.Context, relay.Session) error { return nil }
func (s *gateSink) Ready(context.Context) error                { return nil }
func (s *gateSink) Close(context.Context) error                { return nil }

func (s *gateSink) Publish(ctx context.Context, msgs []relay.Message) (relay.PublishResult, error) {
	select {
	case <-s.gate():
	case <-ctx.Done():
		return relay.PublishResult{}, ctx.Err()
	}
	s.mu.Lock()
	s.got = append(s.got, msgs...)
	s.mu.Unlock()
	return relay.PublishResult{}, nil
}

// TestReadinessSeesAHungSink runs the core with the poll reader and a sink
// that hangs in Publish while it says it is ready: with an event waiting
// on the sink, the heartbeat behind it cannot reach the log, and Ready
// must fail within the bound and succeed again once the sink lets the
// batch through.
func TestReadinessSeesAHungSink(t *testing.T) {
	ctx := context.Background()
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	src, err := poller.New(poller.Config{DatabaseURL: url, PollInterval: 100 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	sink := &gateSink{open: open}
	m := relay.NewMetrics()
	r, err := relay.New(relay.Config{DatabaseURL: url, SourceKind: "poll", Lease: time.Second, ReadyTimeout: time.Second,
		Logger: log, Metrics: m}, src, sink)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	waitReady := func(ready bool) error {
		t.Helper()
		var err error
		if !testwait.Poll(30*time.Second, func() bool { err = r.Ready(ctx); return (err == nil) == ready }) {
			t.Fatalf("Ready: %v after 30s, want ready=%v", err, ready)
		}
		return err
	}
	waitReady(true)
	// Several heartbeats through, with nothing else to publish.
	time.Sleep(time.Second) // deliberate pause: several heartbeats pass before readiness is asked again
	waitReady(true)

	sink.mu.Lock()
	sink.open = make(chan struct{})
	sink.mu.Unlock()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', 'k', 'v')`); err != nil {
		t.Fatal(err)
	}
	err = waitReady(false)
	if !strings.Contains(err.Error(), "no heartbeat reached the log") {
		t.Fatalf("hung sink: Ready says %v, want the heartbeat named", err)
	}
	var age dto.Metric
	if err := m.HeartbeatAge.Write(&age); err != nil || age.GetGauge().GetValue() < 0.5 {
		t.Fatalf("hung sink: relay_heartbeat_age_seconds %v (%v) while not ready", age.GetGauge().GetValue(), err)
	}
	close(sink.gate())
	waitReady(true)
	sink.mu.Lock()
	got := sink.got
	sink.mu.Unlock()
	if len(got) != 1 || got[0].Topic != "orders" {
		t.Fatalf("the sink got %d messages (%v), want the one event and no heartbeat", len(got), got)
	}
}
