package poller_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/leakcheck"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	testbin.Cleanup()
	leakcheck.Exit(code)
}

func runArgs(url, dataDir, httpAddr string, extra ...string) []string {
	return append([]string{"run", "--database-url", url, "--data-dir", dataDir, "--http-addr", httpAddr,
		"--source", "poll", "--poll-interval", "200ms", "--log-level", "debug"}, extra...)
}

// relayEnv is an end-to-end test's migrated database, relay binary, data
// directory and HTTP address.
type relayEnv struct {
	t                       *testing.T
	url, bin, dataDir, addr string
}

func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	url, bin := e2e.Migrated(t)
	return &relayEnv{t: t, url: url, bin: bin, dataDir: e2e.DataDir(t), addr: e2e.FreeAddr(t)}
}

// start runs the relay on the env with runArgs and extra.
func (e *relayEnv) start(extra ...string) *e2e.Proc {
	e.t.Helper()
	return e2e.Start(e.t, e.bin, nil, runArgs(e.url, e.dataDir, e.addr, extra...)...)
}

// TestCrashLoopExactlyOnce is the poller's end-to-end proof: 8 concurrent
// writers commit 100,000 events over 1,000 keys (some transactions roll
// back), long transactions take low ids and commit after thousands of later
// ones (one of them last of all), and the relay is SIGKILLed at random
// moments at least 10 times, a third of them while its acknowledgements are
// held back. The log must hold every committed event exactly once, each
// key's events in commit order, and nothing rolled back.
func TestCrashLoopExactlyOnce(t *testing.T) {
	env := newRelayEnv(t)
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Two long transactions. The first inserts before anything else, so it
	// holds the lowest id, and commits 1.5 s later, after thousands of later
	// transactions, which are published meanwhile; its row comes in the
	// first tick after its commit. The second inserts when 90% of the
	// events are written and commits last, after every writer and every
	// kill.
	long := pgtest.Connect(t, env.url)
	longTx, err := long.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	insertLong := func(tx pgx.Tx, p e2e.Payload) {
		body, _ := json.Marshal(p)
		if _, err := tx.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', $1, $2, '{"test":"e2e"}')`, p.Key, body); err != nil {
			t.Error(err)
		}
	}
	first := e2e.Payload{ID: "long-tx-first", Key: "long-key-1", Seq: 0}
	insertLong(longTx, first)
	last := e2e.Payload{ID: "long-tx-last", Key: "long-key-2", Seq: 0}
	lastConn := pgtest.Connect(t, env.url)
	lastTx, err := lastConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lastStarted := make(chan struct{})
	go func() {
		defer close(lastStarted)
		for ledger.Len() < 90_000 {
			time.Sleep(10 * time.Millisecond) // condition poll: waits for the ledger to reach 90 000
		}
		insertLong(lastTx, last)
	}()

	relay := env.start()
	longDone := make(chan error, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond) // deliberate pause: holds the long transaction open so the reader meets it
		longDone <- longTx.Commit(ctx)
	}()
	writeDone := e2e.WriteAsync(ctx, e2e.CrashLoad(env.url, 100_000, 1000), ledger)

	locker := pgtest.Connect(t, env.url)
	skips := 0
	relay, kills, _ := e2e.KillLoop{
		Locker: locker, Rand: rand.New(rand.NewPCG(1, 2)), MinKills: 10,
		Every:   [2]time.Duration{30 * time.Millisecond, 430 * time.Millisecond},
		Hold:    [2]time.Duration{50 * time.Millisecond, 300 * time.Millisecond},
		Restart: func() *e2e.Proc { return env.start() },
		Killed:  func(p *e2e.Proc) { skips += strings.Count(p.Output(), "skipped re-delivered events") },
	}.Run(t, ctx, relay, writeDone)
	if err := <-longDone; err != nil {
		t.Fatal(err)
	}
	ledger.Record(first)
	<-lastStarted
	if err := lastTx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ledger.Record(last)

	e2e.WaitDrained(t, env.url, "outbox", 3*time.Minute)
	relay.Stop(time.Minute)
	records := e2e.ReadLog(t, env.dataDir, "orders")
	n := e2e.Check(t, records, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("the log has %d records for %d committed events", n, len(ledger.Committed))
	}
	t.Logf("%d events exactly once in per-key order through %d SIGKILLs (%d times a restarted relay skipped re-delivered events already in the log); %d rolled-back events absent",
		n, kills, skips, len(ledger.RolledBack))
}

// TestSIGTERMDrainsAndExits stops the relay with SIGTERM in the middle of a
// backlog: it exits 0 promptly, and a restart publishes the rest with
// nothing lost or duplicated.
func TestSIGTERMDrainsAndExits(t *testing.T) {
	env := newRelayEnv(t)
	ledger := e2e.NewLedger()
	ctx := context.Background()
	if err := e2e.Write(ctx, e2e.WriterConfig{URL: env.url, Schema: "outbox", Topic: "orders", Writers: 4,
		Events: 40_000, Keys: 100, PerTx: 50}, ledger); err != nil {
		t.Fatal(err)
	}
	relay := env.start("--batch-size", "200")
	e2e.WaitPublished(t, env.url, 1, time.Minute)
	start := time.Now()
	relay.Stop(30 * time.Second)
	t.Logf("exited 0 %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(relay.Output(), "relay stopped") {
		t.Fatalf("no clean stop in the log:\n%s", relay.Output())
	}
	relay = env.start()
	e2e.WaitDrained(t, env.url, "outbox", 2*time.Minute)
	relay.Stop(30 * time.Second)
	e2e.Check(t, e2e.ReadLog(t, env.dataDir, "orders"), ledger)
}

// TestLeaderTakeover runs two relays on one outbox and one data directory:
// one leads, the other waits as standby and takes over within 5 s of the
// leader's SIGKILL. Every event is in the log exactly once.
func TestLeaderTakeover(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir := e2e.DataDir(t)
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	a := e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t))...)
	e2e.WaitRole(t, a, "leader", 30*time.Second)
	b := e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t))...)
	e2e.WaitRole(t, b, "standby", 30*time.Second)

	writeDone := e2e.WriteAsync(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 4,
		Events: 20_000, Keys: 200, PerTx: 5}, ledger)
	e2e.WaitPublished(t, url, 2000, time.Minute)
	a.Kill()
	killed := time.Now()
	e2e.WaitRole(t, b, "leader", 5*time.Second)
	took := time.Since(killed)
	if err := <-writeDone; err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	b.Stop(30 * time.Second)
	n := e2e.Check(t, e2e.ReadLog(t, dataDir, "orders"), ledger)
	t.Logf("standby took over %v after the leader's SIGKILL; %d events exactly once", took.Round(time.Millisecond), n)
}

// TestDeadLetters: an invalid topic, an oversize payload and malformed
// headers go to the dead-letter table with their errors; the events around
// them are published in order.
func TestDeadLetters(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir := e2e.DataDir(t)
	conn := pgtest.Connect(t, url)
	ctx := context.Background()
	insert := func(topic, key string, payload []byte, headers string) {
		t.Helper()
		var h any
		if headers != "" {
			h = headers
		}
		if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ($1, $2, $3, $4::text::jsonb)`, topic, key, payload, h); err != nil {
			t.Fatal(err)
		}
	}
	good := func(i int) []byte { return fmt.Appendf(nil, `{"id":"good-%d","key":"k","seq":%d}`, i, i) }
	insert("orders", "k", good(0), "")
	insert("bad topic!", "k", []byte("x"), "")
	insert("orders", "k", good(1), "")
	insert("orders", "k", []byte(strings.Repeat("x", 5000)), "")
	insert("orders", "k", good(2), "")
	insert("orders", "k", []byte("y"), `{"n": 1}`)
	insert("orders", "k", good(3), `{"trace-id":"abc"}`)
	insert(strings.Repeat("t", 250), "k", []byte("z"), "")
	insert("orders", "k", good(4), "")

	relay := e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t), "--max-message-bytes", "4096")...)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	relay.Stop(30 * time.Second)
	rows, err := conn.Query(ctx, "SELECT topic, error FROM outbox.dead_letters ORDER BY event_row_id")
	if err != nil {
		t.Fatal(err)
	}
	var dead []string
	for rows.Next() {
		var topic, msg string
		if err := rows.Scan(&topic, &msg); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, msg)
	}
	want := []string{"invalid topic", "too large", "invalid headers", "invalid topic"}
	if len(dead) != len(want) {
		t.Fatalf("dead letters = %q, want %d of them", dead, len(want))
	}
	for i, w := range want {
		if !strings.Contains(dead[i], w) {
			t.Errorf("dead letter %d: %q, want it to mention %q", i, dead[i], w)
		}
	}
	records := e2e.ReadLog(t, dataDir, "orders")
	if len(records) != 5 {
		t.Fatalf("the log has %d records, want the 5 good events", len(records))
	}
	for i, r := range records {
		if want := string(good(i)); string(r.Value) != want {
			t.Fatalf("record %d = %s, want %s", i, r.Value, want)
		}
	}
	if records[3].Headers["trace-id"] != "abc" {
		t.Fatalf("headers of the row were not published: %v", records[3].Headers)
	}
	if !strings.Contains(relay.Output(), "dead letters") {
		t.Fatal("dead letters were not logged")
	}
}

// TestSwitchReaders runs the WAL reader, then the polling reader, then the
// WAL reader again on one outbox and log: their positions are not
// comparable, and nothing may be skipped or published twice on a switch.
func TestSwitchReaders(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir := e2e.DataDir(t)
	ledger := e2e.NewLedger()
	ctx := context.Background()
	for i, source := range []string{"cdc", "poll", "cdc"} {
		if err := e2e.Write(ctx, e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 2,
			Events: 2000, Keys: 50, PerTx: 10}, ledger); err != nil {
			t.Fatal(err)
		}
		// The last --source wins.
		relay := e2e.Start(t, bin, nil, runArgs(url, dataDir, e2e.FreeAddr(t), "--source", source)...)
		e2e.WaitDrained(t, url, "outbox", time.Minute)
		relay.Signal(syscall.SIGTERM)
		if code := relay.Wait(30 * time.Second); code != 0 {
			t.Fatalf("run %d (%s) exited %d", i, source, code)
		}
	}
	if n := e2e.Check(t, e2e.ReadLog(t, dataDir, "orders"), ledger); n != 6000 {
		t.Fatalf("%d records, want 6000", n)
	}
}
