package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup, removeExample) }

var example struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// exampleBinary builds examples/inbox-consumer once per test process.
func exampleBinary(t testing.TB) string {
	t.Helper()
	example.once.Do(func() {
		example.dir, example.err = os.MkdirTemp("", "inbox-example-")
		if example.err != nil {
			return
		}
		example.path = filepath.Join(example.dir, "inbox-consumer")
		cmd := exec.Command("go", "build", "-o", example.path, "../examples/inbox-consumer")
		if out, err := cmd.CombinedOutput(); err != nil {
			example.err = fmt.Errorf("building the example consumer: %v\n%s", err, out)
		}
	})
	if example.err != nil {
		t.Fatal(example.err)
	}
	return example.path
}

func removeExample() {
	if example.dir != "" {
		os.RemoveAll(example.dir)
	}
}

// relayWithListener starts a relay (poll reader, embedded log) serving the
// Kafka listener on a free address, with extra flags.
func relayWithListener(t *testing.T, url, bin, dataDir, kafkaAddr string, extra ...string) *e2e.Proc {
	t.Helper()
	args := append([]string{"run", "--database-url", url, "--data-dir", dataDir, "--http-addr", e2e.FreeAddr(t),
		"--kafka-addr", kafkaAddr, "--source", "poll", "--poll-interval", "100ms"}, extra...)
	p := e2e.Start(t, bin, nil, args...)
	e2e.WaitRole(t, p, "leader", time.Minute)
	return p
}

// shipment is one row of the example's shipments table.
type shipment struct {
	id      int64
	eventID string
	p       e2e.Payload
}

func readShipments(t testing.TB, ctx context.Context, db *pgxpool.Pool) []shipment {
	t.Helper()
	rows, err := db.Query(ctx, `SELECT id, event_id, payload::text FROM shipments ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []shipment
	for rows.Next() {
		var (
			s    shipment
			body string
		)
		if err := rows.Scan(&s.id, &s.eventID, &body); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(body), &s.p); err != nil {
			t.Fatalf("shipment %d: %v", s.id, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkShipments is the checker: every committed event shipped exactly
// once (by payload id and by event id), nothing rolled back shipped, and
// each key's events shipped in the order they were committed.
func checkShipments(t testing.TB, rows []shipment, ledger *e2e.Ledger) {
	t.Helper()
	byID, byEvent := map[string]int{}, map[string]int{}
	lastSeq := map[string]int{}
	bad := 0
	for _, s := range rows {
		byID[s.p.ID]++
		byEvent[s.eventID]++
		if ledger.RolledBack[s.p.ID] {
			t.Errorf("event %s was rolled back but shipped", s.p.ID)
		}
		if last, ok := lastSeq[s.p.Key]; ok && s.p.Seq <= last && bad < 10 {
			bad++
			t.Errorf("key %s: seq %d shipped after seq %d", s.p.Key, s.p.Seq, last)
		}
		lastSeq[s.p.Key] = s.p.Seq
	}
	dups := 0
	for id, n := range byID {
		if n > 1 {
			dups++
			if dups <= 10 {
				t.Errorf("event %s shipped %d times", id, n)
			}
		}
	}
	for id, n := range byEvent {
		if n > 1 && dups == 0 {
			t.Errorf("event id %s shipped %d times", id, n)
		}
	}
	missing := 0
	for id := range ledger.Committed {
		if byID[id] == 0 {
			missing++
			if missing <= 10 {
				t.Errorf("event %s committed but never shipped", id)
			}
		}
	}
	if dups+missing > 0 {
		t.Fatalf("%d events shipped more than once, %d never, of %d committed", dups, missing, len(ledger.Committed))
	}
}

// waitShipped waits until n distinct events are shipped.
func waitShipped(t testing.TB, ctx context.Context, db *pgxpool.Pool, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var got int
	for {
		if err := db.QueryRow(ctx, `SELECT count(DISTINCT event_id) FROM shipments`).Scan(&got); err != nil && !isUndefinedTable(err) {
			t.Fatal(err)
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events shipped after %v", got, n, timeout)
		}
		time.Sleep(100 * time.Millisecond) // a condition poll: the consumers are other processes
	}
}

func isUndefinedTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P01"
}

// membersUnderKills runs three example consumers in group shipping against
// brokers while writers commit events, SIGKILLs and restarts a random
// member every killEvery, and calls midway once (to restart the relay).
// It returns when every committed event is shipped, then checks them.
func membersUnderKills(t *testing.T, url, brokers string, events int, killEvery time.Duration, midway func(), memberArgs ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin := exampleBinary(t)
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	start := func() *e2e.Proc {
		args := append([]string{"--database-url", url, "--brokers", brokers, "--group", "shipping", "--topic", "orders", "--batch", "20"}, memberArgs...)
		return e2e.Start(t, bin, nil, args...)
	}
	members := []*e2e.Proc{start(), start(), start()}
	ledger := e2e.NewLedger()
	cfg := e2e.CrashLoad(url, events, 400)
	written := e2e.WriteAsync(ctx, cfg, ledger)

	kills, didMidway := 0, false
	rng := rand.New(rand.NewPCG(7, 7))
	ticker := time.NewTicker(killEvery)
	defer ticker.Stop()
	var writeErr error
	writing := true
	for writing || kills < 6 {
		select {
		case writeErr = <-written:
			writing = false
			written = nil
		case <-ticker.C:
			i := rng.IntN(len(members))
			members[i].Kill()
			members[i] = start()
			kills++
			if kills == 3 && !didMidway {
				midway()
				didMidway = true
			}
		case <-ctx.Done():
			t.Fatal("timed out")
		}
	}
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	if !didMidway {
		midway()
	}
	waitShipped(t, ctx, db, len(ledger.Committed), 5*time.Minute)
	for _, m := range members {
		m.Signal(syscall.SIGTERM)
	}
	for _, m := range members {
		if code := m.Wait(time.Minute); code != 0 {
			t.Errorf("a member exited %d after SIGTERM:\n%s", code, m.Output())
		}
	}
	rows := readShipments(t, ctx, db)
	checkShipments(t, rows, ledger)
	var dead int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM inbox.dead_letters`).Scan(&dead); err != nil || dead != 0 {
		t.Errorf("dead letters: %d (%v)", dead, err)
	}
	t.Logf("%d events shipped exactly once in key order; %d member kills, relay restarted once", len(rows), kills)
}

// TestInboxMembersKilled: three members of a group consume 20,000 events
// from the relay's embedded log while members are SIGKILLed and restarted
// and the relay itself is SIGKILLed and restarted; each event's side
// effect exists exactly once, in key order.
func TestInboxMembersKilled(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	dataDir, kafkaAddr := e2e.DataDir(t), e2e.FreeAddr(t)
	relay := relayWithListener(t, url, bin, dataDir, kafkaAddr, "--partitions", "6")
	membersUnderKills(t, url, kafkaAddr, 20000, 2*time.Second, func() {
		relay.Kill()
		relay = relayWithListener(t, url, bin, dataDir, kafkaAddr, "--partitions", "6")
	})
	relay.Stop(time.Minute)
}

// TestInboxMembersKilledKafka is TestInboxMembersKilled with the relay
// publishing to a Kafka cluster (franz-go's kfake, in this process), which
// the members consume. The members use the consumer group protocol of
// KIP-848 here (the embedded-log test keeps the classic one): kfake's classic
// coordinator never expires a member killed while its JoinGroup waits (the
// member's session timer starts only once a reply reaches it) and restarts
// the rebalance deadline on every join, so the survivors' staggered rejoins
// keep the group preparing a rebalance forever, which Apache Kafka does not
// do. CI met that livelock, and so did one of two runs on a workstation.
func TestInboxMembersKilledKafka(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	cluster := kafkatest.Start(t)
	start := func() *e2e.Proc {
		p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", e2e.FreeAddr(t),
			"--source", "poll", "--poll-interval", "100ms", "--sink", "kafka", "--kafka-brokers", cluster.Addrs()[0],
			"--kafka-create-topics", "--kafka-topic-partitions", "6", "--kafka-addr", "")
		e2e.WaitRole(t, p, "leader", time.Minute)
		return p
	}
	relay := start()
	membersUnderKills(t, url, cluster.Addrs()[0], 20000, 2*time.Second, func() {
		relay.Kill()
		relay = start()
	}, "--group-protocol", "consumer")
	relay.Stop(time.Minute)
}
