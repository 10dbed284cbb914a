package upgrade_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// lease is the relays' leader lease: short, so takeovers are quick.
const lease = time.Second

// release is one relay binary and the version it is.
type release struct{ version, bin string }

// rig is one rolling upgrade: a database, the sink's place, the binaries.
type rig struct {
	t        *testing.T
	url      string
	old, cur release
	source   string
	// base are the `relay run` flags every node shares; perNode makes
	// each node's own (its data directory with the Kafka sink).
	base    []string
	perNode func() []string
	// kafka is the cluster of the Kafka sink, nil with the embedded one.
	kafka   *kafkatest.Cluster
	dataDir string
}

// node is one relay: its HTTP address stays across restarts, its binary
// changes when it is replaced.
type node struct {
	r    *rig
	name string
	addr string
	rel  release
	proc *e2e.Proc
}

func (r *rig) node(name string) *node {
	return &node{r: r, name: name, addr: e2e.FreeAddr(r.t)}
}

// start runs n as rel.
func (n *node) start(rel release) *node {
	n.r.t.Helper()
	n.rel = rel
	args := append(append([]string{"run", "--http-addr", n.addr}, n.r.base...), n.r.perNode()...)
	n.proc = e2e.Start(n.r.t, rel.bin, nil, args...)
	return n
}

func (n *node) String() string { return n.name + "@" + n.rel.version }

// migrate runs `relay migrate up` of rel and fails the test unless it
// exits 0.
func (r *rig) migrate(rel release) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := testbin.Run(ctx, rel.bin, nil, "migrate", "up", "--database-url", r.url)
	if err != nil || res.Code != 0 {
		r.t.Fatalf("%s: migrate up: %v (exit %d)\n%s%s", rel.version, err, res.Code, res.Stdout, res.Stderr)
	}
	r.t.Logf("%s: migrate up: %s", rel.version, strings.TrimSpace(res.Stdout))
}

// leaderOf waits for one of nodes to report itself leader through /readyz
// and returns it.
func leaderOf(t *testing.T, nodes ...*node) *node {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		for _, n := range nodes {
			if !n.proc.Exited() && n.proc.Role() == "leader" {
				return n
			}
		}
		time.Sleep(20 * time.Millisecond) // condition poll: roles of other processes
	}
	t.Fatalf("no leader among %v after a minute", nodes)
	return nil
}

// TestRollingUpgrade: three relays of the previous release (a leader, two
// standbys) under load; the current release's `relay migrate up` runs
// beside them; one standby is replaced by the current release; the leader
// is SIGKILLed, and then the next leader, so the leadership passes
// between the releases; every old relay left is SIGKILLed and replaced.
// Nothing is lost, duplicated or reordered per key, and no relay wrote
// after a newer leader had (producer epochs never go back in a
// partition). With the poll reader and the WAL reader on the embedded
// broker (one data directory for all three, written by both releases),
// and the WAL reader on the Kafka sink in its exactly-once mode.
func TestRollingUpgrade(t *testing.T) {
	prev := testbin.PreviousRelease(t)
	old := release{version: prev.Version, bin: prev.Path}
	cur := release{version: "current", bin: testbin.Relay(t)}
	for _, tc := range []struct{ source, sink string }{{"poll", "embedded"}, {"cdc", "embedded"}, {"cdc", "kafka"}} {
		t.Run(tc.source+"-"+tc.sink, func(t *testing.T) { rollingUpgrade(t, old, cur, tc.source, tc.sink) })
	}
}

func rollingUpgrade(t *testing.T, old, cur release, source, sink string) {
	r := &rig{t: t, url: pgtest.NewDatabase(t), old: old, cur: cur, source: source, perNode: func() []string { return nil }}
	r.base = []string{"--database-url", r.url, "--kafka-addr", "", "--source", source, "--leader-lease", lease.String()}
	switch source {
	case "poll":
		r.base = append(r.base, "--poll-interval", "100ms")
	case "cdc":
		cfg, err := pgx.ParseConfig(r.url)
		if err != nil {
			t.Fatal(err)
		}
		r.base = append(r.base, "--slot", "slot_"+cfg.Database, "--heartbeat-interval", "200ms")
	}
	switch sink {
	case "embedded":
		r.dataDir = e2e.DataDir(t)
		r.base = append(r.base, "--data-dir", r.dataDir)
	case "kafka":
		r.kafka = kafkatest.Start(t)
		r.base = append(r.base, "--sink", "kafka", "--kafka-brokers", strings.Join(r.kafka.Addrs(), ","),
			"--kafka-create-topics", "--kafka-topic-partitions", "8", "--kafka-transactional-id", "relay-upgrade",
			"--kafka-dial-timeout", "3s")
		r.perNode = func() []string { return []string{"--data-dir", e2e.DataDir(t)} }
	}
	r.migrate(old)

	a, b, c := r.node("a"), r.node("b"), r.node("c")
	nodes := []*node{a, b, c}
	e2e.WaitRole(t, a.start(old).proc, "leader", time.Minute)
	e2e.WaitRole(t, b.start(old).proc, "standby", time.Minute)
	e2e.WaitRole(t, c.start(old).proc, "standby", time.Minute)
	ledger := e2e.NewLedger()
	cfg := e2e.WriterConfig{URL: r.url, Schema: "outbox", Topic: "orders", Writers: 4, Events: 2000, Keys: 200,
		PerTx: 10, RollbackEvery: 25, PayloadBytes: 100}
	stopWriting := e2e.WriteSteadily(context.Background(), cfg, ledger, 50*time.Millisecond)
	admin := pgtest.Connect(t, r.url)
	progress := func(what string) {
		t.Helper()
		n, err := e2e.Published(context.Background(), admin)
		if err != nil {
			t.Fatal(err)
		}
		e2e.WaitPublished(t, r.url, n+800, time.Minute)
		t.Logf("%s: %d events published", what, n+800)
	}
	progress("three relays of " + old.version)

	// The new release's migrations run under the old relays' load, and
	// the old leader keeps publishing and acknowledging after them.
	r.migrate(cur)
	progress(old.version + " leading on the migrated schema")

	// Replace a standby.
	b.proc.Kill()
	e2e.WaitRole(t, b.start(cur).proc, "standby", time.Minute)

	// SIGKILL the leader, then the next one: the leadership passes from
	// the old release to a standby of either release, and on.
	var leaders []string
	first := leaderOf(t, nodes...)
	leaders = append(leaders, first.String())
	for round := 0; round < 2; round++ {
		killed := leaderOf(t, nodes...)
		was := killed.String()
		killed.proc.Kill()
		next := leaderOf(t, nodes...)
		leaders = append(leaders, next.String())
		e2e.WaitRole(t, killed.start(cur).proc, "standby", time.Minute)
		progress(fmt.Sprintf("round %d: %s killed (back as the current release), %s leads", round+1, was, next))
	}
	// Replace whatever old relay is left, leader or standby.
	for _, n := range nodes {
		if n.rel == old {
			n.proc.Kill()
			n.start(cur)
			final := leaderOf(t, nodes...)
			if final.String() != leaders[len(leaders)-1] {
				leaders = append(leaders, final.String())
			}
			progress(n.name + " replaced")
		}
	}
	if err := stopWriting(); err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitDrained(t, r.url, "outbox", 2*time.Minute)
	for _, n := range nodes {
		if n.rel != cur {
			t.Fatalf("relay %s was not replaced", n)
		}
		e2e.WaitReady(t, n.proc, n.proc.Role() == "leader", time.Minute)
		n.proc.Stop(time.Minute)
	}
	crossed := false
	for i := 1; i < len(leaders); i++ {
		crossed = crossed || strings.HasSuffix(leaders[i-1], "@"+old.version) && strings.HasSuffix(leaders[i], "@"+cur.version)
	}
	if !crossed {
		t.Errorf("the leadership never passed from %s to the current release: %v", old.version, leaders)
	}

	var records []e2e.Record
	if r.kafka == nil {
		records = e2e.ReadLog(t, r.dataDir, "orders")
	} else {
		for _, kr := range kafkatest.ReadRecords(t, r.kafka.Addrs(), "orders", true) {
			h := map[string]string{}
			for _, hh := range kr.Headers {
				h[hh.Key] = string(hh.Value)
			}
			records = append(records, e2e.Record{Topic: kr.Topic, Partition: kr.Partition, Offset: kr.Offset,
				Key: string(kr.Key), Value: kr.Value, Headers: h, ProducerID: kr.ProducerID, ProducerEpoch: kr.ProducerEpoch})
		}
	}
	n := e2e.Check(t, records, ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("%d records for %d committed events", n, len(ledger.Committed))
	}
	checkOneWriterAtATime(t, records)
	t.Logf("%d events exactly once in per-key order, %d rolled back absent; leaders in turn: %v", n, len(ledger.RolledBack), leaders)
}

// checkOneWriterAtATime fails when, in a partition, a record of an older
// producer session (producer id, epoch) follows one of a newer session: a
// deposed leader wrote after its successor had.
func checkOneWriterAtATime(t *testing.T, records []e2e.Record) {
	t.Helper()
	type session struct {
		id    int64
		epoch int16
	}
	last := map[int32]session{}
	ended := map[int32]map[session]bool{}
	violations := e2e.NewViolations(t)
	for _, rec := range records {
		s := session{rec.ProducerID, rec.ProducerEpoch}
		prev, ok := last[rec.Partition]
		if ok && prev != s {
			if ended[rec.Partition] == nil {
				ended[rec.Partition] = map[session]bool{}
			}
			ended[rec.Partition][prev] = true
			if ended[rec.Partition][s] || (s.id == prev.id && s.epoch < prev.epoch) {
				violations.Errorf("partition %d: offset %d written by producer %d epoch %d after producer %d epoch %d had written: two leaders at once",
					rec.Partition, rec.Offset, s.id, s.epoch, prev.id, prev.epoch)
			}
		}
		last[rec.Partition] = s
	}
}
