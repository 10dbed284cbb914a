package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(envShareMember); addr != "" {
		fmt.Fprintln(os.Stderr, "share member:", runShareMember(addr))
		os.Exit(1)
	}
	pgtest.Main(m, testbin.Cleanup)
}

// lease is the leader lease the tests run with: short, so that takeovers
// are quick, and long enough for a loaded 2-core machine to renew it.
const lease = time.Second

// takeoverBound is how long after its leader stops renewing (paused,
// partitioned) a standby must have taken over: one lease, which is what
// the design waits, plus 3 s for a loaded 2-core machine (a poll of the
// lease row, the takeover transaction, the test's /readyz polling).
const takeoverBound = lease + 3*time.Second

// releaseBound is how long after a partition starts the partitioned leader
// may take to stop its pipeline and release the data directory, so that
// the new leader publishes while the partition lasts: its lease runs out
// within Lease*4/5, its queries are cancelled, and 10 s are left for a
// loaded machine.
const releaseBound = lease + 10*time.Second

// env is one test's migrated database, shared data directory and binary.
type env struct {
	t       *testing.T
	url     string
	bin     string
	dataDir string
	admin   *pgx.Conn
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url, bin := e2e.Migrated(t)
	return &env{t: t, url: url, bin: bin, dataDir: e2e.DataDir(t), admin: pgtest.Connect(t, url)}
}

// node is one relay process behind its own fault proxy to PostgreSQL; it
// keeps its proxy and HTTP address across restarts.
type node struct {
	e     *env
	name  string
	proxy *e2e.Proxy
	url   string
	addr  string
	args  []string
	proc  *e2e.Proc
}

// newNode makes a node whose relay runs `relay run` with the test's
// defaults and extra flags; start runs it.
func (e *env) newNode(name string, extra ...string) *node {
	e.t.Helper()
	proxy, url := e2e.ProxyURL(e.t, e.url)
	n := &node{e: e, name: name, proxy: proxy, url: url, addr: e2e.FreeAddr(e.t)}
	n.args = append([]string{"run", "--database-url", url, "--data-dir", e.dataDir, "--http-addr", n.addr,
		"--kafka-addr", "", "--source", "poll", "--poll-interval", "100ms", "--leader-lease", lease.String()}, extra...)
	return n
}

func (n *node) start() *node {
	n.e.t.Helper()
	n.proc = e2e.Start(n.e.t, n.e.bin, nil, n.args...)
	return n
}

// startPair starts a and waits for it to lead, then b and waits for it to
// stand by.
func startPair(a, b *node) {
	a.e.t.Helper()
	e2e.WaitRole(a.e.t, a.start().proc, "leader", 30*time.Second)
	e2e.WaitRole(b.e.t, b.start().proc, "standby", 30*time.Second)
}

// pairUnderLoad starts a leader a and a standby b, and steady writers
// (rounds of 1000 events 50 ms apart, into the returned ledger); it
// returns once 3000 are published.
func (e *env) pairUnderLoad() (a, b *node, ledger *e2e.Ledger, stopWriters func()) {
	e.t.Helper()
	ledger = e2e.NewLedger()
	a, b = e.newNode("a"), e.newNode("b")
	startPair(a, b)
	stopWriters = e.steady(1000, 50*time.Millisecond, ledger)
	e2e.WaitPublished(e.t, e.url, 3000, time.Minute)
	return a, b, ledger, stopWriters
}

// listenerWithEvents starts a relay serving the Kafka listener on a free
// address, with the extra flags, and has it publish events committed
// events into the returned ledger; it returns the node and the address.
func (e *env) listenerWithEvents(events int, extra ...string) (*node, string, *e2e.Ledger) {
	e.t.Helper()
	addr := e2e.FreeAddr(e.t)
	n := e.newNode("relay", append([]string{"--kafka-addr", addr}, extra...)...)
	n.start()
	e2e.WaitRole(e.t, n.proc, "leader", 30*time.Second)
	ledger := e2e.NewLedger()
	if err := e2e.Write(context.Background(), e.writers(events), ledger); err != nil {
		e.t.Fatal(err)
	}
	e2e.WaitPublished(e.t, e.url, int64(ledger.Len()), time.Minute)
	return n, addr, ledger
}

// stop ends the node's relay with SIGTERM and expects a clean exit.
func (n *node) stop() {
	n.e.t.Helper()
	n.proc.Signal(syscall.SIGTERM)
	if code := n.proc.Wait(time.Minute); code != 0 {
		n.e.t.Fatalf("relay %s exited %d after SIGTERM:\n%s", n.name, code, n.proc.Output())
	}
}

// writers is the load of most tests: 8 writers over 400 keys, one
// transaction in 25 rolled back.
func (e *env) writers(events int) e2e.WriterConfig {
	return e2e.WriterConfig{URL: e.url, Schema: "outbox", Topic: "orders", Writers: 8, Events: events, Keys: 400,
		PerTx: 10, RollbackEvery: 25, PayloadBytes: 100}
}

// steady keeps the writers committing rounds of events until the returned
// stop is called.
func (e *env) steady(events int, pause time.Duration, ledger *e2e.Ledger) (stop func()) {
	stopWriting := e2e.WriteSteadily(context.Background(), e.writers(events), ledger, pause)
	return func() {
		e.t.Helper()
		if err := stopWriting(); err != nil {
			e.t.Fatalf("writers: %v", err)
		}
	}
}

// checkAll reads the log back and fails unless it holds every committed
// event exactly once, in per-key order, and nothing else.
func (e *env) checkAll(ledger *e2e.Ledger) int {
	e.t.Helper()
	return e2e.CheckLog(e.t, e.dataDir, ledger)
}

// epoch is the leadership epoch in the database.
func (e *env) epoch() int64 {
	e.t.Helper()
	var n int64
	if err := e.admin.QueryRow(context.Background(), "SELECT epoch FROM outbox.leadership").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// published is what the checkpoint counts as published, and when it last
// changed.
type published struct {
	count   int64
	updated time.Time
}

func (e *env) published() published {
	e.t.Helper()
	var p published
	err := e.admin.QueryRow(context.Background(), "SELECT published, updated_at FROM outbox.checkpoints WHERE name = 'default'").Scan(&p.count, &p.updated)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		e.t.Fatal(err)
	}
	return p
}

// terminate ends the sessions of n's relay (those that reach PostgreSQL
// through its proxy) with pg_terminate_backend; appName, when set, picks
// the sessions with that application_name. It returns how many it ended.
func (n *node) terminate(appName string) int {
	n.e.t.Helper()
	var ended int
	err := n.e.admin.QueryRow(context.Background(), `SELECT count(*) FROM (
    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
    WHERE datname = current_database() AND client_port = ANY($1) AND ($2 = '' OR application_name = $2)) AS t`,
		n.proxy.Ports(), appName).Scan(&ended)
	if err != nil {
		n.e.t.Fatal(err)
	}
	return ended
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // condition poll (the package's waitFor)
	}
	return time.Since(start)
}

// leaderOf returns which of nodes /readyz names the leader, waiting up to
// timeout for one to be.
func leaderOf(t *testing.T, timeout time.Duration, nodes ...*node) *node {
	t.Helper()
	var leader *node
	waitFor(t, timeout, "a leader", func() bool {
		for _, n := range nodes {
			if n.proc.Role() == "leader" {
				leader = n
				return true
			}
		}
		return false
	})
	return leader
}

// batchInfo is one record batch of the log, as its header tells it.
type batchInfo struct {
	partition        int32
	base, last       int64
	producerID       int64
	epoch            int16
	baseSeq, lastSeq int32
}

// readBatches lists the batches of topic in a data directory no process
// holds, partition by partition in offset order.
func readBatches(t *testing.T, dataDir, topic string) []batchInfo {
	t.Helper()
	var out []batchInfo
	e2e.EachBatch(t, dataDir, topic, func(part int32, raw []byte) {
		h, err := broker.ParseBatchHeader(raw)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, batchInfo{partition: part, base: h.BaseOffset, last: h.LastOffset(), producerID: h.ProducerID,
			epoch: h.ProducerEpoch, baseSeq: h.BaseSequence, lastSeq: h.LastSequence()})
	})
	return out
}

// checkEpochOrder fails when, in some partition, a batch of an older
// producer epoch follows one of a newer epoch: a fenced session appended
// after its successor had started.
func checkEpochOrder(t *testing.T, batches []batchInfo) (epochs int) {
	t.Helper()
	last := map[int32]batchInfo{}
	seen := map[int16]bool{}
	for _, b := range batches {
		seen[b.epoch] = true
		if prev, ok := last[b.partition]; ok && (b.producerID != prev.producerID || b.epoch < prev.epoch) {
			t.Errorf("partition %d: batch at %d (producer %d epoch %d) follows batch at %d (producer %d epoch %d)",
				b.partition, b.base, b.producerID, b.epoch, prev.base, prev.producerID, prev.epoch)
		}
		last[b.partition] = b
	}
	return len(seen)
}

// committedOffsets sums the offsets group has committed on topic (on
// every topic when topic is ""); a partition whose offset could not be
// fetched makes it an error.
func committedOffsets(ctx context.Context, cl *kgo.Client, group, topic string) (int64, error) {
	offs, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err == nil {
		err = offs.Error()
	}
	if err != nil {
		return 0, err
	}
	var n int64
	offs.Each(func(o kadm.OffsetResponse) {
		if topic == "" || o.Topic == topic {
			n += o.At
		}
	})
	return n, nil
}

// outputCount counts lines of p's log that contain s.
func outputCount(p *e2e.Proc, s string) int { return strings.Count(p.Output(), s) }
