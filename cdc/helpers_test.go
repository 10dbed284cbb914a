package cdc_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/leakcheck"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/internal/testlog"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	testbin.Cleanup()
	leakcheck.Exit(code)
}

// fixture is one test's migrated database and a source config for it.
type fixture struct {
	url  string
	conn *pgx.Conn
	cfg  cdc.Config
}

func setup(t testing.TB) *fixture {
	t.Helper()
	url, conn := pgtest.MigratedDatabase(t, migrations.DefaultSchema)
	// Slots belong to the cluster, so each test's are named after its
	// database.
	return &fixture{url: url, conn: conn, cfg: cdc.Config{
		DatabaseURL:       url,
		SlotName:          "slot_" + conn.Config().Database,
		HeartbeatInterval: 200 * time.Millisecond,
		StatusInterval:    100 * time.Millisecond,
		Logger:            testLogger(t),
	}}
}

// testLogger sends the source's logs to the test log.
func testLogger(t testing.TB) *slog.Logger { return testlog.New(t, slog.LevelDebug) }

// start returns a started source closed when the test ends.
func (f *fixture) start(t *testing.T, from relay.Position) *cdc.Source {
	t.Helper()
	src, err := cdc.New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Start(ctx, from); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close(context.Background()) })
	return src
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// openTx inserts an event (topic t) on a connection of its own in a
// transaction it leaves open for the test to commit; the connection closes
// when the test ends.
func (f *fixture) openTx(t *testing.T, key, payload string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.Connect(t, f.url)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) VALUES ('t', $1, convert_to($2, 'UTF8'))", key, payload); err != nil {
		t.Fatal(err)
	}
	return tx
}

// core plays the relay core's part: it drops events at or before the last
// acknowledged position, deletes the delivered rows and acknowledges them,
// as the core does after its sink made them durable.
type core struct {
	t    *testing.T
	url  string
	conn *pgx.Conn
	src  *cdc.Source
	max  int

	mu    sync.Mutex
	got   []relay.Event
	acked relay.Position
	// batches records the size of every batch Next returned.
	batches []int
}

// startCore starts a source from the position and a core acknowledging
// its events, both closed when the test ends.
func (f *fixture) startCore(t *testing.T, from relay.Position) (*cdc.Source, *core) {
	t.Helper()
	src := f.start(t, from)
	return src, newCore(t, f.url, src, from)
}

func newCore(t *testing.T, url string, src *cdc.Source, from relay.Position) *core {
	c := &core{t: t, url: url, src: src, max: 1000, acked: from}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	t.Cleanup(func() { c.conn.Close(context.Background()) })
	return c
}

// collect reads until it holds n events in total or the timeout passes.
func (c *core) collect(n int, timeout time.Duration) []relay.Event {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for len(c.got) < n {
		events, err := c.src.Next(ctx, c.max)
		if err != nil {
			c.t.Fatalf("Next after %d of %d events: %v", len(c.got), n, err)
		}
		c.deliver(ctx, events)
	}
	return c.got
}

func (c *core) deliver(ctx context.Context, events []relay.Event) {
	c.t.Helper()
	c.batches = append(c.batches, len(events))
	var ids []int64
	for _, e := range events {
		if !c.acked.Less(e.Position) {
			continue
		}
		c.got = append(c.got, e)
		ids = append(ids, e.ID)
		c.acked = e.Position
	}
	if len(ids) == 0 {
		return
	}
	// Like the core, retry the acknowledgement until Postgres takes it
	// (a test may restart the server).
	for attempt := 0; ; attempt++ {
		// The core's fenced transaction allows the delete that migration
		// 011's trigger refuses otherwise; so does this session.
		_, err := c.conn.Exec(ctx, "SET relay.allow_outbox_changes = on")
		if err == nil {
			_, err = c.conn.Exec(ctx, "DELETE FROM outbox.events WHERE id = ANY($1)", ids)
		}
		if err == nil {
			break
		}
		if attempt == 100 {
			c.t.Fatalf("deleting published rows: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // retry backoff: the connection is re-made before the retry
		if conn, cerr := pgx.Connect(ctx, c.url); cerr == nil {
			c.conn.Close(ctx)
			c.conn = conn
		}
	}
	if err := c.src.Acked(ctx, c.acked); err != nil {
		c.t.Fatalf("Acked: %v", err)
	}
}

// quiet checks that no event arrives within d.
func (c *core) quiet(d time.Duration) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	events, err := c.src.Next(ctx, c.max)
	if err == nil {
		c.t.Fatalf("unexpected events: %d, first %+v", len(events), events[0])
	}
}

// checkOrder checks that positions strictly increase.
func checkOrder(t *testing.T, events []relay.Event) {
	t.Helper()
	for i := 1; i < len(events); i++ {
		if !events[i-1].Position.Less(events[i].Position) {
			t.Fatalf("positions not increasing at %d: %v then %v", i, events[i-1].Position, events[i].Position)
		}
	}
}

// slotFlush reads the slot's confirmed flush LSN as a number.
func slotFlush(t *testing.T, conn *pgx.Conn, slot string) uint64 {
	t.Helper()
	var lsn uint64
	err := conn.QueryRow(context.Background(),
		"SELECT (confirmed_flush_lsn - '0/0')::numeric::bigint FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testwait.For(t, timeout, what, cond)
}

// insertN inserts events whose payloads are the numbers from, from+1, ...
// in one transaction.
func insertN(t *testing.T, url string, from, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_, err = conn.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) SELECT 't', 'k' || (g % 3), convert_to(g::text, 'UTF8') FROM generate_series($1::int, $2::int) AS g",
				from, from+n-1)
			conn.Close(ctx)
			if err == nil {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("inserting events %d..%d: %v", from, from+n-1, err)
		}
		time.Sleep(100 * time.Millisecond) // retry backoff: inserting again after a failure
	}
}

// checkNoneTwice fails the test if two events carry the same payload and
// returns the payloads seen.
func checkNoneTwice(t *testing.T, events []relay.Event) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range events {
		p := string(e.Payload)
		if seen[p] {
			t.Fatalf("event %s delivered twice", p)
		}
		seen[p] = true
	}
	return seen
}

// checkExactlyOnce checks that events carry the payloads 1..n once each,
// per key in payload order, with increasing positions.
func checkExactlyOnce(t *testing.T, events []relay.Event, n int) {
	t.Helper()
	checkOrder(t, events)
	seen := checkNoneTwice(t, events)
	last := map[string]int{}
	for _, e := range events {
		p := string(e.Payload)
		var v int
		fmt.Sscan(p, &v)
		if prev, ok := last[string(e.Key)]; ok && prev > v {
			t.Fatalf("key %s: %d arrived after %d", e.Key, v, prev)
		}
		last[string(e.Key)] = v
	}
	for i := 1; i <= n; i++ {
		if !seen[fmt.Sprint(i)] {
			t.Fatalf("event %d lost", i)
		}
	}
	if len(events) != n {
		t.Fatalf("%d events, want %d", len(events), n)
	}
}

// relayEnv is an end-to-end test's migrated database (named db), data
// directory and binary.
type relayEnv struct {
	t       *testing.T
	url     string
	db      string
	bin     string
	dataDir string
	addr    string
	slot    string
}

func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	url := pgtest.NewDatabase(t)
	bin := e2e.MigrateURL(t, url)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	return &relayEnv{t: t, url: url, db: cfg.Database, bin: bin, dataDir: e2e.DataDir(t), addr: e2e.FreeAddr(t), slot: "slot_" + cfg.Database}
}

// start runs `relay run --source cdc` on the test's database.
func (e *relayEnv) start(extra ...string) *e2e.Proc {
	e.t.Helper()
	args := []string{"run", "--source", "cdc", "--database-url", e.url, "--data-dir", e.dataDir, "--http-addr", e.addr,
		"--slot", e.slot, "--heartbeat-interval", "200ms", "--log-level", "debug", "--kafka-addr", ""}
	return e2e.Start(e.t, e.bin, nil, append(args, extra...)...)
}

// underLoad starts the relay, and the crash tests' writers committing
// events over 1000 keys into the returned ledger; ctx ends after timeout.
func (e *relayEnv) underLoad(timeout time.Duration, events int) (ctx context.Context, relay *e2e.Proc, ledger *e2e.Ledger, writeDone <-chan error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	e.t.Cleanup(cancel)
	ledger = e2e.NewLedger()
	relay = e.start()
	return ctx, relay, ledger, e2e.WriteAsync(ctx, e2e.CrashLoad(e.url, events, 1000), ledger)
}

// killLoop is the crash tests' kill loop on the relay: SIGKILLs at least
// minKills times, each after a pause between every[0] and every[1], every
// third with the acknowledgements held back for 100 to 400 ms, each
// followed by a restart.
func (e *relayEnv) killLoop(src rand.Source, minKills int, every [2]time.Duration) e2e.KillLoop {
	return e2e.KillLoop{
		Locker: pgtest.Connect(e.t, e.url), Rand: rand.New(src), MinKills: minKills,
		Every:     every,
		Hold:      [2]time.Duration{100 * time.Millisecond, 400 * time.Millisecond},
		Restart:   func() *e2e.Proc { return e.start() },
		Published: e2e.LogRecords(e.dataDir),
	}
}
