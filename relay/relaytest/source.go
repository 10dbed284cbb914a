// Package relaytest holds the conformance suites every relay.Source and
// relay.Sink must pass. Each implementation's tests call RunSourceTests or
// RunSinkTests with a constructor; the suites drive the implementation as
// the core does and check the contract in relay/source.go and
// relay/sink.go against real Postgres and a real log.
package relaytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
)

// NewSource builds the source under test for a migrated database (schema
// "outbox"). The suite calls Start and Close.
type NewSource func(t *testing.T, databaseURL string) relay.Source

// RunSourceTests runs the Source conformance suite. The calling package
// must run its tests under pgtest.Main.
func RunSourceTests(t *testing.T, newSource NewSource) {
	t.Run("DeliversCommittedRowsWithEveryField", func(t *testing.T) { testFields(t, newSource) })
	t.Run("NeverDeliversRolledBackRows", func(t *testing.T) { testRollback(t, newSource) })
	t.Run("LateCommitOfLowIDIsNotSkipped", func(t *testing.T) { testLateCommit(t, newSource) })
	t.Run("KeepsPerKeyCommitOrder", func(t *testing.T) { testKeyOrder(t, newSource) })
	t.Run("WakesOnCommit", func(t *testing.T) { testWake(t, newSource) })
	t.Run("RespectsMaxAndPositionsIncrease", func(t *testing.T) { testMax(t, newSource) })
	t.Run("ResumesAfterAcknowledgedPosition", func(t *testing.T) { testResume(t, newSource) })
	t.Run("NextEndsWithContext", func(t *testing.T) { testCancel(t, newSource) })
}

type sourceEnv struct {
	t    *testing.T
	url  string
	conn *pgx.Conn
	src  relay.Source
	last relay.Position
}

func setupSource(t *testing.T, newSource NewSource) *sourceEnv {
	t.Helper()
	url, conn := pgtest.MigratedDatabase(t, migrations.DefaultSchema)
	return &sourceEnv{t: t, url: url, conn: conn, src: newSource(t, url)}
}

func (e *sourceEnv) start(from relay.Position) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.src.Start(ctx, from); err != nil {
		e.t.Fatalf("Start: %v", err)
	}
	e.last = from
	e.t.Cleanup(func() { e.src.Close(context.Background()) })
}

// insert commits one transaction writing (key, payload) pairs on topic t.
func (e *sourceEnv) insert(tx pgx.Tx, topic string, kv ...string) {
	e.t.Helper()
	ctx := context.Background()
	for i := 0; i+1 < len(kv); i += 2 {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ($1, $2, $3)`, topic, kv[i], []byte(kv[i+1])); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *sourceEnv) commit(topic string, kv ...string) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.insert(tx, topic, kv...)
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// collect reads until n events arrived (dropping those at or before the
// last position, as the core does), acknowledges them like the core
// (delete the rows, then Acked), and fails the test if the timeout passes
// first.
func (e *sourceEnv) collect(n int, timeout time.Duration) []relay.Event {
	e.t.Helper()
	out := e.collectUpTo(n, timeout)
	if len(out) < n {
		e.t.Fatalf("got %d of %d events before the timeout", len(out), n)
	}
	return out
}

func (e *sourceEnv) ack(events []relay.Event) {
	e.t.Helper()
	if len(events) == 0 {
		return
	}
	ids := make([]int64, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	ctx := context.Background()
	// As the core's fenced acknowledgement does, allow the delete that
	// migration 011's trigger refuses otherwise.
	if _, err := e.conn.Exec(ctx, "SET relay.allow_outbox_changes = on"); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, "DELETE FROM outbox.events WHERE id = ANY($1)", ids); err != nil {
		e.t.Fatal(err)
	}
	if err := e.src.Acked(ctx, events[len(events)-1].Position); err != nil {
		e.t.Fatalf("Acked: %v", err)
	}
}

// expectNothing checks that no new event arrives within d.
func (e *sourceEnv) expectNothing(d time.Duration) {
	e.t.Helper()
	if got := e.collectUpTo(1, d); len(got) > 0 {
		e.t.Fatalf("unexpected event %+v", got[0])
	}
}

func payloads(events []relay.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = string(e.Payload)
	}
	return out
}

func testFields(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	ctx := context.Background()
	var wantID string
	var wantRow int64
	var wantCreated time.Time
	err := e.conn.QueryRow(ctx, `INSERT INTO outbox.events (topic, key, payload, headers)
		VALUES ('orders', 'order-42', '\x7b7d'::bytea, '{"trace-id":"abc","n":"1"}')
		RETURNING event_id::text, id, created_at`).Scan(&wantID, &wantRow, &wantCreated)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('users', NULL, NULL)`); err != nil {
		t.Fatal(err)
	}
	got := e.collect(2, 30*time.Second)
	ev := got[0]
	if ev.Topic != "orders" || string(ev.Key) != "order-42" || string(ev.Payload) != "{}" || ev.EventID != wantID || ev.ID != wantRow {
		t.Fatalf("event = %+v, want topic orders, key order-42, payload {}, event id %s, id %d", ev, wantID, wantRow)
	}
	if !ev.CreatedAt.Equal(wantCreated) {
		t.Fatalf("created_at = %v, want %v", ev.CreatedAt, wantCreated)
	}
	var headers map[string]string
	if err := json.Unmarshal(ev.Headers, &headers); err != nil || headers["trace-id"] != "abc" || headers["n"] != "1" {
		t.Fatalf("headers = %s (%v)", ev.Headers, err)
	}
	tomb := got[1]
	if tomb.Key != nil || tomb.Payload != nil || tomb.Headers != nil {
		t.Fatalf("NULL key/payload/headers delivered as %q/%q/%q, want nil", tomb.Key, tomb.Payload, tomb.Headers)
	}
}

func testRollback(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	ctx := context.Background()
	tx, err := e.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.insert(tx, "orders", "k", "rolled-back")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	e.commit("orders", "k", "committed")
	got := e.collect(1, 30*time.Second)
	if got[0].Payload == nil || string(got[0].Payload) != "committed" {
		t.Fatalf("got %q, want the committed event only", payloads(got))
	}
	e.expectNothing(500 * time.Millisecond)
}

func testLateCommit(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	ctx := context.Background()
	late := pgtest.Connect(t, e.url)
	lateTx, err := late.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.insert(lateTx, "orders", "a", "low-id-committed-late")
	for i := 0; i < 20; i++ {
		e.commit("orders", fmt.Sprintf("b%d", i), fmt.Sprintf("early-%d", i))
	}
	// Let the source see (and pass) the early commits before the late one.
	early := e.collectUpTo(20, 1500*time.Millisecond)
	if err := lateTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rest := e.collect(21-len(early), 30*time.Second)
	all := append(early, rest...)
	found := false
	for _, ev := range all {
		found = found || string(ev.Payload) == "low-id-committed-late"
	}
	if !found {
		t.Fatalf("the event with the lowest id, committed last, was never delivered: %q", payloads(all))
	}
}

// read takes n events with calls of Next(max) within timeout, checking
// that no call returns more than max and that positions increase; unlike
// collect it acknowledges nothing.
func (e *sourceEnv) read(n, max int, timeout time.Duration) []relay.Event {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var all []relay.Event
	for len(all) < n {
		events, err := e.src.Next(ctx, max)
		if err != nil {
			e.t.Fatalf("Next: %v (after %d events)", err, len(all))
		}
		if len(events) > max {
			e.t.Fatalf("Next(max=%d) returned %d events", max, len(events))
		}
		for _, ev := range events {
			if !e.last.Less(ev.Position) {
				e.t.Fatalf("position %v does not increase after %v", ev.Position, e.last)
			}
			e.last = ev.Position
			all = append(all, ev)
		}
	}
	return all
}

// collectUpTo is collect that returns what arrived when the timeout passes.
func (e *sourceEnv) collectUpTo(n int, timeout time.Duration) []relay.Event {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []relay.Event
	for len(out) < n {
		events, err := e.src.Next(ctx, 1000)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			e.t.Fatalf("Next: %v", err)
		}
		for _, ev := range events {
			if e.last.Less(ev.Position) {
				e.last = ev.Position
				out = append(out, ev)
			}
		}
	}
	e.ack(out)
	return out
}

func testKeyOrder(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	const txs = 50
	for i := 0; i < txs; i++ {
		e.commit("orders", "k1", fmt.Sprintf("k1-%03d-a", i), "k2", fmt.Sprintf("k2-%03d", i), "k1", fmt.Sprintf("k1-%03d-b", i))
	}
	got := e.collect(3*txs, 30*time.Second)
	var k1, k2 []string
	for _, ev := range got {
		switch string(ev.Key) {
		case "k1":
			k1 = append(k1, string(ev.Payload))
		case "k2":
			k2 = append(k2, string(ev.Payload))
		}
	}
	for i := 0; i < txs; i++ {
		if k1[2*i] != fmt.Sprintf("k1-%03d-a", i) || k1[2*i+1] != fmt.Sprintf("k1-%03d-b", i) || k2[i] != fmt.Sprintf("k2-%03d", i) {
			t.Fatalf("per-key order broken at transaction %d: k1=%q k2=%q", i, k1, k2)
		}
	}
}

func testWake(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	done := make(chan []relay.Event, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			events, err := e.src.Next(ctx, 10)
			if err != nil || len(events) > 0 {
				done <- events
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	select {
	case evs := <-done:
		t.Fatalf("Next returned %d events before anything was committed", len(evs))
	default:
	}
	committed := time.Now()
	e.commit("orders", "k", "wake")
	evs := <-done
	if len(evs) != 1 || string(evs[0].Payload) != "wake" {
		t.Fatalf("Next returned %q after the commit", payloads(evs))
	}
	t.Logf("woke %v after the commit", time.Since(committed).Round(time.Millisecond))
	e.ack(evs)
}

func testMax(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	var kv []string
	for i := 0; i < 25; i++ {
		kv = append(kv, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
	}
	e.commit("orders", kv...)
	all := e.read(25, 10, 30*time.Second)
	for i, ev := range all {
		if string(ev.Payload) != fmt.Sprintf("v%d", i) {
			t.Fatalf("event %d = %q: insert order within a transaction not kept", i, ev.Payload)
		}
	}
	e.ack(all)
}

func testResume(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	for i := 0; i < 10; i++ {
		e.commit("orders", "k", fmt.Sprintf("v%d", i))
	}
	// Acknowledge the first 4 only, as a core that crashed after them
	// would have; the source restarts at that position.
	seen := e.read(10, 1000, 30*time.Second)
	e.ack(seen[:4])
	acked := seen[3].Position
	e.src.Close(context.Background())

	e.src = newSource(t, e.url)
	e.start(acked)
	for i := 10; i < 12; i++ {
		e.commit("orders", "k", fmt.Sprintf("v%d", i))
	}
	got := e.collect(8, 30*time.Second)
	for i, ev := range got {
		if want := fmt.Sprintf("v%d", i+4); string(ev.Payload) != want {
			t.Fatalf("after restart event %d = %q, want %q (all: %q)", i, ev.Payload, want, payloads(got))
		}
	}
	e.expectNothing(500 * time.Millisecond)
}

func testCancel(t *testing.T, newSource NewSource) {
	e := setupSource(t, newSource)
	e.start(relay.Position{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := e.src.Next(ctx, 10)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next on an idle outbox with an ending context = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Next took %v to notice its context ended", took)
	}
}
