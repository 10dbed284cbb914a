package kafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/leakcheck"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/relay"
	"github.com/outboxrelay/relay/relay/relaytest"
)

// The end-to-end tests run the real binary, `relay run --sink kafka`, with
// the poll and the cdc reader, against the package's PostgreSQL and an
// in-process kfake cluster, and check what Kafka holds against what the
// writers committed.

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	testbin.Cleanup()
	leakcheck.Exit(code)
}

// e2eParts is the partition count of the topics the relay creates.
const e2eParts = 8

// kafkaRelay is one test's migrated database, Kafka cluster and the
// arguments of the relay that connects them.
type kafkaRelay struct {
	t        *testing.T
	url      string
	bin      string
	cluster  *kafkatest.Cluster
	httpAddr string
	args     []string
}

// transactionalID is the relay's --kafka-transactional-id: id in the
// transactional mode, none (an idempotent producer) otherwise.
func transactionalID(txn bool, id string) string {
	if txn {
		return id
	}
	return ""
}

// newKafkaRelay migrates a fresh database with the real binary and starts a
// kfake cluster; source is poll or cdc, txnID (when set) turns on the
// exactly-once mode; extra are more `relay run` flags.
func newKafkaRelay(t *testing.T, source, txnID string, extra ...string) *kafkaRelay {
	t.Helper()
	url := pgtest.NewDatabase(t)
	bin := testbin.Relay(t)
	p := e2e.Start(t, bin, nil, "migrate", "up", "--database-url", url)
	if code := p.Wait(time.Minute); code != 0 {
		t.Fatalf("migrate up: exit %d: %s", code, p.Output())
	}
	cl := kafkatest.Start(t)
	k := &kafkaRelay{t: t, url: url, bin: bin, cluster: cl, httpAddr: e2e.FreeAddr(t)}
	k.args = []string{"run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", k.httpAddr,
		"--source", source, "--sink", "kafka", "--kafka-brokers", strings.Join(cl.Addrs(), ","),
		"--kafka-create-topics", "--kafka-topic-partitions", fmt.Sprint(e2eParts),
		"--kafka-addr", "", "--log-level", "debug"}
	switch source {
	case "poll":
		k.args = append(k.args, "--poll-interval", "200ms")
	case "cdc":
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		k.args = append(k.args, "--slot", "slot_"+cfg.Database, "--heartbeat-interval", "200ms")
	}
	if txnID != "" {
		k.args = append(k.args, "--kafka-transactional-id", txnID)
	}
	k.args = append(k.args, extra...)
	return k
}

func (k *kafkaRelay) start() *e2e.Proc {
	k.t.Helper()
	return e2e.Start(k.t, k.bin, nil, k.args...)
}

// stop waits until p is ready (a SIGTERM in its first instants, before
// it handles signals or while it connects, is not a graceful stop), then
// ends it with SIGTERM and expects a clean exit.
func (k *kafkaRelay) stop(p *e2e.Proc) {
	k.t.Helper()
	e2e.WaitReady(k.t, p, true, time.Minute)
	p.Stop(time.Minute)
}

// kafkaResult is what checkKafka found.
type kafkaResult struct {
	records int
	// dups is the number of records that repeat an earlier record's event;
	// dupIDs names those events (each once).
	dups   int
	dupIDs []string
}

// checkKafka asserts that records (one topic, by partition and offset)
// hold every committed event of the ledger and nothing rolled back; that
// each carries its key, headers and a relay-event-id that its repeats
// share; that each key is on broker.PartitionForKey's partition of parts;
// and that the first copies of each key's events are in commit order.
// Repeats are counted, not failed: the caller decides what its mode allows.
func checkKafka(t *testing.T, records []relaytest.Record, ledger *e2e.Ledger, parts int32) kafkaResult {
	t.Helper()
	seen := map[string]int{}
	eventID := map[string]string{}
	lastSeq := map[string]int{}
	violations := e2e.NewViolations(t)
	fail := violations.Errorf
	var res kafkaResult
	res.records = len(records)
	for i, r := range records {
		var p e2e.Payload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			fail("record %d (partition %d): payload %q is not a test payload: %v", i, r.Partition, r.Value, err)
			continue
		}
		h := map[string]string{}
		for _, hd := range r.Headers {
			h[hd.Key] = string(hd.Value)
		}
		id := h[relay.HeaderEventID]
		if id == "" || h["test"] != "e2e" {
			fail("event %s lacks its headers: %v", p.ID, h)
		}
		seen[p.ID]++
		if seen[p.ID] > 1 {
			res.dups++
			if seen[p.ID] == 2 {
				res.dupIDs = append(res.dupIDs, p.ID)
			}
			if eventID[p.ID] != id {
				fail("event %s repeated with relay-event-id %s, first copy %s", p.ID, id, eventID[p.ID])
			}
			continue
		}
		eventID[p.ID] = id
		if ledger.RolledBack[p.ID] {
			fail("event %s from a rolled-back transaction was published (partition %d)", p.ID, r.Partition)
		}
		if string(r.Key) != p.Key {
			fail("event %s has key %q in Kafka, %q written", p.ID, r.Key, p.Key)
		}
		if want := broker.PartitionForKey(r.Key, parts); r.Partition != want {
			fail("key %s is on partition %d, the embedded broker picks %d", p.Key, r.Partition, want)
		}
		if last, ok := lastSeq[p.Key]; ok && p.Seq <= last {
			fail("key %s: event seq %d (%s) comes after seq %d (partition %d)", p.Key, p.Seq, p.ID, last, r.Partition)
		} else {
			lastSeq[p.Key] = p.Seq
		}
	}
	e2e.CheckCommitted(t, ledger, seen, violations, len(records), "Kafka")
	return res
}

func (r kafkaResult) String() string {
	ids := r.dupIDs
	more := ""
	if len(ids) > 15 {
		ids, more = ids[:15], fmt.Sprintf(" and %d more", len(r.dupIDs)-15)
	}
	return fmt.Sprintf("%d records, %d duplicate records of %d events %v%s", r.records, r.dups, len(r.dupIDs), ids, more)
}

// Log lines of the exactly-once mode's recovery.
const (
	logSkipped   = "skipped re-delivered events Kafka already committed"
	logRecovered = "Kafka holds committed events the outbox has not acknowledged"
)

// TestE2EKafkaCrashLoop is issue 7's crash acceptance: for each reader
// (poll, cdc) and each mode (at least once, exactly once), 8 writers commit
// 20,000 events over 400 keys (one transaction in 25 rolls back) while the
// relay publishing into kfake is SIGKILLed at least 10 times, every third
// time while its acknowledgements are held back so that the kill lands
// between Kafka's acknowledgement and the checkpoint. Kafka must hold every
// committed event, on its key's murmur2 partition, the first copies in
// per-key commit order, nothing rolled back. At least once: repeats are
// counted and logged (and there must be some, or the kills proved
// nothing: the kill loop writes more events inside a hold until one held
// kill landed, so that this never depends on the machine's speed). Exactly once: a read_committed reader sees no repeat, and a
// restarted relay skipped re-delivered events at least once.
func TestE2EKafkaCrashLoop(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"poll", "cdc"} {
		for _, txn := range []bool{false, true} {
			t.Run(fmt.Sprintf("source=%s/transactional=%v", source, txn), func(t *testing.T) {
				t.Parallel()
				crashLoop(t, source, txn)
			})
		}
	}
}

func crashLoop(t *testing.T, source string, txn bool) {
	k := newKafkaRelay(t, source, transactionalID(txn, "relay-e2e-"+source), "--kafka-publish-timeout", "10s", "--kafka-dial-timeout", "3s")
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	proc := k.start()
	began := time.Now()
	writeDone := e2e.WriteAsync(ctx, e2e.CrashLoad(k.url, 20_000, 400), ledger)

	locker := pgtest.Connect(t, k.url)
	seed := uint64(len(source))
	if txn {
		seed += 100
	}
	skips, recovered := 0, 0
	count := func(p *e2e.Proc) {
		out := p.Output()
		skips += strings.Count(out, logSkipped)
		recovered += strings.Count(out, logRecovered)
	}
	proc, kills, held := e2e.KillLoop{
		Locker: locker, Rand: rand.New(rand.NewPCG(seed, 7)), MinKills: 10,
		Every:   [2]time.Duration{200 * time.Millisecond, 1000 * time.Millisecond},
		Hold:    [2]time.Duration{100 * time.Millisecond, 500 * time.Millisecond},
		Restart: k.start,
		Killed:  count,
		// Each kill with acknowledgements held back waits until Kafka
		// holds more of the batches the hold keeps unacknowledged.
		Published: k.cluster.Records(t, "orders", txn),
		More:      e2e.MoreOf(e2e.CrashLoad(k.url, 0, 400), 400, ledger),
	}.Run(t, ctx, proc, writeDone)
	written := time.Since(began)
	e2e.WaitDrained(t, k.url, "outbox", 2*time.Minute)
	drained := time.Since(began)
	k.stop(proc)
	count(proc)
	stopped := time.Since(began)
	res := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", txn), ledger, e2eParts)
	t.Logf("stopped after %v, read back after %v", stopped.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	t.Logf("%d committed events (%d rolled back absent) through %d SIGKILLs (%d with acknowledgements held back); kill loop ended after %v, outbox drained after %v",
		len(ledger.Committed), len(ledger.RolledBack), kills, held, written.Round(time.Millisecond), drained.Round(time.Millisecond))
	if txn {
		uncommitted := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", false), ledger, e2eParts)
		t.Logf("exactly once, read_committed: %v", res)
		t.Logf("read_uncommitted (aborted transactions included): %v", uncommitted)
		t.Logf("restarted relays found committed but unacknowledged events %d times and skipped their re-delivery %d times", recovered, skips)
		if res.dups > 0 {
			t.Errorf("%d duplicates for a read_committed reader in the transactional mode", res.dups)
		}
		if skips == 0 {
			t.Errorf("no restarted relay skipped re-delivered events: the kills never landed between Kafka's commit and the acknowledgement")
		}
		return
	}
	t.Logf("at least once: %v", res)
	if res.dups == 0 {
		t.Errorf("no duplicates: no kill landed between Kafka's acknowledgement and Postgres's, the test proves nothing")
	}
}

// TestE2EKafkaOutage is issue 7's outage acceptance: while 8 writers keep
// committing, the Kafka cluster stops for 30 s and returns. During the
// outage /readyz reports not ready and the outbox keeps the events (the
// oldest row stays, the table only grows); afterwards /readyz reports ready
// again, the backlog drains, and Kafka holds every committed event in
// per-key order (exactly once in the transactional mode).
func TestE2EKafkaOutage(t *testing.T) {
	eachMode(t, outage)
}

func outage(t *testing.T, txn bool) {
	k := newKafkaRelay(t, "poll", transactionalID(txn, "relay-e2e-outage"), "--kafka-publish-timeout", "5s", "--kafka-dial-timeout", "2s")
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	proc := k.start()
	e2e.WaitReady(t, proc, true, time.Minute)

	// Writers run in rounds of 200 events until stopped: a steady load
	// across the outage.
	stopWriting := e2e.WriteSteadily(ctx, e2e.WriterConfig{URL: k.url, Schema: "outbox", Topic: "orders", Writers: 8,
		Events: 200, Keys: 200, PerTx: 5, PayloadBytes: 120}, ledger, 300*time.Millisecond)
	conn := pgtest.Connect(t, k.url)
	e2e.WaitPublished(t, k.url, 2000, time.Minute)

	const outageFor = 30 * time.Second
	k.cluster.Stop()
	down := time.Now()
	before := ledger.Len()
	e2e.WaitReady(t, proc, false, 20*time.Second)
	notReadyAfter := time.Since(down)

	// The outbox keeps everything while Kafka is away: sample it, and
	// readiness, through the outage.
	var oldest int64
	var rows []int64
	readyDuring := 0
	for time.Since(down) < outageFor-time.Second {
		time.Sleep(2 * time.Second) // deliberate pause: samples the outbox every 2 s through the outage
		var n, minID int64
		if err := conn.QueryRow(ctx, "SELECT count(*), coalesce(min(id), 0) FROM outbox.events").Scan(&n, &minID); err != nil {
			t.Fatal(err)
		}
		if oldest == 0 {
			oldest = minID
		} else if minID != oldest {
			t.Errorf("the oldest outbox row changed from %d to %d while Kafka was down: rows were deleted", oldest, minID)
		}
		rows = append(rows, n)
		if ok, _ := proc.Ready(); ok {
			readyDuring++
		}
		if proc.Exited() {
			t.Fatalf("the relay exited during the outage:\n%s", proc.Output())
		}
	}
	if !slices.IsSorted(rows) || rows[0] == 0 {
		t.Errorf("outbox rows during the outage: %v, want a non-empty table that only grows", rows)
	}
	if readyDuring > 0 {
		t.Errorf("/readyz reported ready %d times during the outage", readyDuring)
	}
	written := ledger.Len() - before
	time.Sleep(outageFor - time.Since(down)) // simulates the rest of the Kafka outage
	k.cluster.Restart()
	up := time.Now()
	e2e.WaitReady(t, proc, true, time.Minute)
	readyAfter := time.Since(up)

	// Some more load after the outage, then drain.
	time.Sleep(2 * time.Second) // deliberate pause: 2 s more load after the outage
	if err := stopWriting(); err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitDrained(t, k.url, "outbox", 2*time.Minute)
	drained := time.Since(up)
	k.stop(proc)
	res := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", txn), ledger, e2eParts)
	t.Logf("%d events committed (%d during the %v outage); outbox rows sampled during it %v; /readyz not ready %v after the stop, ready %v after the restart; drained %v after it; %v",
		len(ledger.Committed), written, outageFor, rows, notReadyAfter.Round(time.Millisecond), readyAfter.Round(time.Millisecond), drained.Round(time.Millisecond), res)
	if txn && res.dups > 0 {
		t.Errorf("%d duplicates for a read_committed reader in the transactional mode", res.dups)
	}
}

// TestE2EKafkaPartitionParity: 10,000 keys (and 300 keyless events)
// published by the real binary into a 7-partition Kafka topic land where
// the embedded broker puts them: broker.PartitionForKey of the key, or of
// the relay-event-id for a keyless event.
func TestE2EKafkaPartitionParity(t *testing.T) {
	t.Parallel()
	const parts = 7
	k := newKafkaRelay(t, "poll", "", "--kafka-topic-partitions", fmt.Sprint(parts))
	conn := pgtest.Connect(t, k.url)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 'parity', CASE WHEN i % 3 = 0 THEN md5(i::text) ELSE 'customer-' || i END, convert_to('v' || i, 'UTF8')
FROM generate_series(0, 9999) AS i`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 'parity', NULL, convert_to('keyless' || i, 'UTF8') FROM generate_series(0, 299) AS i`); err != nil {
		t.Fatal(err)
	}
	proc := k.start()
	e2e.WaitDrained(t, k.url, "outbox", 2*time.Minute)
	k.stop(proc)
	records := kafkatest.Read(t, k.cluster.Addrs(), "parity", false)
	if len(records) != 10_300 {
		t.Fatalf("read %d records, want 10,300", len(records))
	}
	used := map[int32]int{}
	keys := map[string]bool{}
	for _, r := range records {
		k := r.Key
		if k == nil {
			for _, h := range r.Headers {
				if h.Key == relay.HeaderEventID {
					k = h.Value
				}
			}
		} else {
			keys[string(r.Key)] = true
		}
		if want := broker.PartitionForKey(k, parts); r.Partition != want {
			t.Fatalf("record %s (key %q) on partition %d, the embedded broker picks %d", r.Value, r.Key, r.Partition, want)
		}
		used[r.Partition]++
	}
	if len(keys) != 10_000 || len(used) != parts {
		t.Fatalf("%d distinct keys on %d partitions, want 10,000 on %d", len(keys), len(used), parts)
	}
	t.Logf("10,000 keys and 300 keyless events on the embedded broker's partitions; records per partition %v", used)
}

// TestE2EKafkaKilledInTheCommit kills the exactly-once relay while Kafka
// holds its EndTxn(commit) request, six times under a steady write load.
// Three times the cluster then completes the commit the dead relay asked
// for (its outcome never reached the relay or Postgres); three times it
// drops the request, leaving the transaction open with its events in the
// log until the next relay's fencing aborts it. A read_committed reader must
// see every event once; a read_uncommitted one sees the aborted copies,
// which proves the kills landed inside transactions.
func TestE2EKafkaKilledInTheCommit(t *testing.T) {
	t.Parallel()
	const txnID = "relay-e2e-commit"
	k := newKafkaRelay(t, "poll", txnID, "--kafka-publish-timeout", "10s", "--kafka-dial-timeout", "3s")
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// hold parks the next EndTxn(commit) of the relay's transactional id
	// when armed, reports it on held, and on release lets the cluster
	// commit it (complete) or close the connection without an answer.
	kf := k.cluster.Kfake()
	var (
		mu       sync.Mutex
		armed    bool
		complete bool
		held     = make(chan struct{}, 1)
		release  = make(chan struct{})
		resumed  = make(chan struct{}, 1)
	)
	kf.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r := req.(*kmsg.EndTxnRequest)
		mu.Lock()
		mine := armed && r.Commit && r.TransactionalID == txnID
		if mine {
			armed = false
		}
		through := complete
		rel := release
		mu.Unlock()
		if !mine {
			return nil, nil, false
		}
		held <- struct{}{}
		kf.SleepControl(func() { <-rel })
		// The cluster loop handles requests one by one: the new relay's
		// fencing comes after this request whatever it returns.
		resumed <- struct{}{}
		if through {
			return nil, nil, false
		}
		kf.KeepControl()
		return nil, errors.New("kafkatest: EndTxn dropped"), true
	})

	proc := k.start()
	stopWriting := e2e.WriteSteadily(ctx, e2e.WriterConfig{URL: k.url, Schema: "outbox", Topic: "orders", Writers: 8,
		Events: 400, Keys: 200, PerTx: 5, PayloadBytes: 120}, ledger, 100*time.Millisecond)

	recovered := 0
	for round := range 6 {
		e2e.WaitReady(t, proc, true, time.Minute)
		mu.Lock()
		armed, complete, release = true, round%2 == 0, make(chan struct{})
		rel := release
		mu.Unlock()
		select {
		case <-held:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: no commit reached the cluster in 30 s", round)
		}
		proc.Kill()
		close(rel)
		<-resumed
		proc = k.start()
		if round%2 == 0 {
			// The next relay must learn of the commit from the markers.
			e2e.WaitReady(t, proc, true, time.Minute)
			if strings.Contains(proc.Output(), logRecovered) {
				recovered++
			}
		}
	}
	if err := stopWriting(); err != nil {
		t.Fatalf("writers: %v", err)
	}
	e2e.WaitDrained(t, k.url, "outbox", 2*time.Minute)
	k.stop(proc)
	committed := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", true), ledger, e2eParts)
	uncommitted := checkKafka(t, kafkatest.Read(t, k.cluster.Addrs(), "orders", false), ledger, e2eParts)
	t.Logf("%d events; 6 kills inside EndTxn(commit), 3 completed after the kill (the next relay found them in the markers %d times), 3 dropped", len(ledger.Committed), recovered)
	t.Logf("read_committed: %v", committed)
	t.Logf("read_uncommitted: %v", uncommitted)
	if committed.dups > 0 {
		t.Errorf("%d duplicates for a read_committed reader", committed.dups)
	}
	if recovered != 3 {
		t.Errorf("%d of 3 restarted relays found the commit their predecessor was killed in", recovered)
	}
	if uncommitted.dups == 0 {
		t.Errorf("no aborted records in the log: the dropped commits left no open transaction")
	}
}
