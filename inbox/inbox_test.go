package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/inbox"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testwait"
)

// fixture is one test's database (migrated, with an applied table the
// handlers write) and Kafka cluster (kfake, in process).
type fixture struct {
	t       testing.TB
	ctx     context.Context
	db      *pgxpool.Pool
	brokers string
	cl      *kgo.Client
}

func setup(t testing.TB) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	db, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if err := inbox.Migrate(ctx, db, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE TABLE applied (id bigserial PRIMARY KEY, grp text, key text, value text, event_id text)`); err != nil {
		t.Fatal(err)
	}
	cluster := kafkatest.Start(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &fixture{t: t, ctx: ctx, db: db, brokers: cluster.Addrs()[0], cl: cl}
}

func (f *fixture) createTopic(name string, partitions int32) {
	f.t.Helper()
	resp, err := kadm.NewClient(f.cl).CreateTopics(f.ctx, partitions, 1, nil, name)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		f.t.Fatal(err)
	}
}

// produce writes one record per "key=value" to partition p of topic, each
// with the event id "id-<value>" unless the value says otherwise.
func (f *fixture) produce(topic string, p int32, kvs ...string) {
	f.t.Helper()
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		r := &kgo.Record{Topic: topic, Partition: p, Key: []byte(k), Value: []byte(v),
			Headers: []kgo.RecordHeader{{Key: inbox.EventIDHeader, Value: []byte("id-" + v)}}}
		if err := f.cl.ProduceSync(f.ctx, r).FirstErr(); err != nil {
			f.t.Fatal(err)
		}
	}
}

// recording is a handler that writes each record into applied.
func recording(group string) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
		id, _ := inbox.HeaderEventID(r)
		_, err := tx.Exec(ctx, `INSERT INTO applied (grp, key, value, event_id) VALUES ($1, $2, $3, $4)`, group, string(r.Key), string(r.Value), id)
		return err
	}
}

func (f *fixture) consumer(cfg inbox.Config) *inbox.Consumer {
	f.t.Helper()
	cfg.DB = f.db
	cfg.Kafka = append(cfg.Kafka, kgo.SeedBrokers(f.brokers), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if cfg.Handler == nil {
		cfg.Handler = recording(cfg.Group)
	}
	c, err := inbox.New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// run runs c until the returned stop is called; stop checks Run's error.
func (f *fixture) run(c *inbox.Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() {
		f.t.Helper()
		cancel()
		if err := <-done; err != nil {
			f.t.Fatalf("Run: %v", err)
		}
	}
}

// eventually polls cond until it holds.
func (f *fixture) eventually(what string, cond func() (bool, error)) {
	f.t.Helper()
	testwait.Until(f.t, time.Minute, what, func() error {
		ok, err := cond()
		if err != nil {
			f.t.Fatalf("%s: %v", what, err)
		}
		if !ok {
			return errors.New("not yet")
		}
		return nil
	})
}

func (f *fixture) count(q string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.db.QueryRow(f.ctx, q, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// applied returns group's applied values of key in the order applied.
func (f *fixture) applied(group, key string) []string {
	f.t.Helper()
	rows, err := f.db.Query(f.ctx, `SELECT value FROM applied WHERE grp = $1 AND key = $2 ORDER BY id`, group, key)
	if err != nil {
		f.t.Fatal(err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return vs
}

func TestInboxDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.createTopic("t", 1)
	f.produce("t", 0, "a=a1", "a=poison", "a=a3", "b=b1", "a=a4")
	var fixed atomic.Bool
	flaky := func(group string) inbox.Handler {
		rec := recording(group)
		return func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
			if string(r.Value) == "poison" && !fixed.Load() {
				return errors.New("cannot ship a poison order")
			}
			return rec(ctx, tx, r)
		}
	}
	processed := func(group string) func() (bool, error) {
		return func() (bool, error) {
			return f.count(`SELECT count(*) FROM inbox.processed WHERE consumer_group = $1`, group) == 5, nil
		}
	}

	t.Run("skip record", func(t *testing.T) {
		c := f.consumer(inbox.Config{Group: "skip", Topics: []string{"t"}, MaxAttempts: 3, RetryBackoff: time.Millisecond, Handler: flaky("skip")})
		stop := f.run(c)
		f.eventually("all five settled", processed("skip"))
		stop()
		if got := strings.Join(f.applied("skip", "a"), ","); got != "a1,a3,a4" {
			t.Errorf("key a applied %s, want a1,a3,a4", got)
		}
		dl, err := c.DeadLetters(f.ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 1 || string(dl[0].Value) != "poison" || dl[0].Attempts != 3 || dl[0].Held || !strings.Contains(dl[0].Reason, "poison order") {
			t.Fatalf("dead letters: %+v", dl)
		}
		if dl[0].EventID != "id-poison" || dl[0].Record().Headers[0].Key != inbox.EventIDHeader {
			t.Errorf("dead letter lost the record's identity: %+v", dl[0])
		}
		if err := c.Discard(f.ctx, dl[0].ID); err != nil {
			t.Fatal(err)
		}
		if err := c.Discard(f.ctx, dl[0].ID); err == nil {
			t.Error("discarding a dead letter twice succeeded")
		}
	})

	t.Run("hold key", func(t *testing.T) {
		c := f.consumer(inbox.Config{Group: "hold", Topics: []string{"t"}, MaxAttempts: 2, RetryBackoff: time.Millisecond,
			Policy: inbox.HoldKey, Handler: flaky("hold")})
		stop := f.run(c)
		f.eventually("all five settled", processed("hold"))
		stop()
		if got := strings.Join(f.applied("hold", "a"), ","); got != "a1" {
			t.Errorf("key a applied %s, want a1 with the rest held", got)
		}
		if got := strings.Join(f.applied("hold", "b"), ","); got != "b1" {
			t.Errorf("key b applied %s, want b1: another key is not held", got)
		}
		dl, err := c.DeadLetters(f.ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(dl) != 3 || string(dl[0].Value) != "poison" || dl[0].Held || !dl[1].Held || !dl[2].Held {
			t.Fatalf("dead letters: %+v", dl)
		}
		if err := c.Retry(f.ctx, dl[1].ID); !errors.Is(err, inbox.ErrNotFirst) {
			t.Fatalf("retrying a held record before the failed one: %v, want ErrNotFirst", err)
		}
		if err := c.Retry(f.ctx, dl[0].ID); err == nil {
			t.Fatal("retry of a record that still fails succeeded")
		}
		fixed.Store(true)
		for _, d := range dl {
			if err := c.Retry(f.ctx, d.ID); err != nil {
				t.Fatalf("retry %d: %v", d.ID, err)
			}
		}
		if got := strings.Join(f.applied("hold", "a"), ","); got != "a1,poison,a3,a4" {
			t.Errorf("key a applied %s after the retries, want a1,poison,a3,a4", got)
		}
		// A redelivery of everything is skipped: the ids are processed.
		f.produce("t", 0, "a=a3")
		stop = f.run(c)
		f.eventually("the duplicate skipped", func() (bool, error) {
			return testutil.ToFloat64(c.Metrics().Duplicates.WithLabelValues("hold", "t")) == 1, nil
		})
		stop()
		if n := f.count(`SELECT count(*) FROM applied WHERE grp = 'hold'`); n != 5 {
			t.Errorf("%d records applied, want 5", n)
		}
	})
}

// TestInboxPruneRedeliveryWindow forgets ids around a redelivery: the
// group's offsets are moved back (as when a member dies after its database
// commits but before its offset commit), the prune runs with no retention,
// and the redelivered records are still skipped; ids above the committed
// offsets survive any prune, and a duplicate published later at a new
// offset is skipped while the retention window lasts.
func TestInboxPruneRedeliveryWindow(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.createTopic("p", 2)
	for p := int32(0); p < 2; p++ {
		var kvs []string
		for i := 0; i < 100; i++ {
			kvs = append(kvs, fmt.Sprintf("k%d=p%d-%d", i%7, p, i))
		}
		f.produce("p", p, kvs...)
	}
	c := f.consumer(inbox.Config{Group: "g", Topics: []string{"p"}, PruneInterval: -1, RetainFor: time.Nanosecond, BatchSize: 10})
	stop := f.run(c)
	f.eventually("200 applied", func() (bool, error) { return f.count(`SELECT count(*) FROM applied`) == 200, nil })
	stop()

	adm := kadm.NewClient(f.cl)
	back := kadm.Offsets{}
	back.Add(kadm.Offset{Topic: "p", Partition: 0, At: 40, LeaderEpoch: -1})
	back.Add(kadm.Offset{Topic: "p", Partition: 1, At: 60, LeaderEpoch: -1})
	if err := adm.CommitAllOffsets(f.ctx, "g", back); err != nil {
		t.Fatal(err)
	}
	committed, err := inbox.CommittedOffsets(f.ctx, f.cl, "g")
	if err != nil {
		t.Fatal(err)
	}
	if committed["p"][0] != 40 || committed["p"][1] != 60 {
		t.Fatalf("committed offsets %v", committed)
	}
	pruned, err := c.Prune(f.ctx, committed)
	if err != nil {
		t.Fatal(err)
	}
	if pruned != 100 {
		t.Fatalf("pruned %d ids, want the 100 below the committed offsets", pruned)
	}
	if n := f.count(`SELECT count(*) FROM inbox.processed WHERE (partition = 0 AND "offset" < 40) OR (partition = 1 AND "offset" < 60)`); n != 0 {
		t.Fatalf("%d ids below the committed offsets kept", n)
	}

	stop = f.run(c)
	f.eventually("100 redelivered and skipped", func() (bool, error) {
		return testutil.ToFloat64(c.Metrics().Duplicates.WithLabelValues("g", "p")) == 100, nil
	})
	stop()
	if n := f.count(`SELECT count(*) FROM applied`); n != 200 {
		t.Fatalf("%d applied after the redelivery, want 200", n)
	}

	// Within the retention window, ids past the committed offsets stay,
	// and a late duplicate of one (a new offset, the same event id) is
	// skipped.
	c2 := f.consumer(inbox.Config{Group: "g", Topics: []string{"p"}, PruneInterval: -1, RetainFor: time.Hour})
	committed, err = inbox.CommittedOffsets(f.ctx, f.cl, "g")
	if err != nil {
		t.Fatal(err)
	}
	if committed["p"][0] != 100 || committed["p"][1] != 100 {
		t.Fatalf("committed offsets after the redelivery %v", committed)
	}
	if pruned, err := c2.Prune(f.ctx, committed); err != nil || pruned != 0 {
		t.Fatalf("pruned %d (%v) within the retention window", pruned, err)
	}
	f.produce("p", 1, "k3=p0-50")
	stop = f.run(c2)
	f.eventually("the late duplicate skipped", func() (bool, error) {
		return testutil.ToFloat64(c2.Metrics().Duplicates.WithLabelValues("g", "p")) == 1, nil
	})
	stop()
	if n := f.count(`SELECT count(*) FROM applied`); n != 200 {
		t.Fatalf("%d applied after the late duplicate, want 200", n)
	}
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c, err := inbox.New(inbox.Config{DB: db, Group: "g", Topics: []string{"t"}, Schema: "custom", Handler: recording("g"),
		Kafka: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), "inbox.Migrate") {
		t.Fatalf("Run on an unmigrated schema: %v, want the fix named", err)
	}
	for i := 0; i < 2; i++ {
		if err := inbox.Migrate(ctx, db, "custom"); err != nil {
			t.Fatalf("migrate %d: %v", i, err)
		}
	}
	ms, err := inbox.Migrations("custom")
	if err != nil || len(ms) == 0 || !strings.Contains(ms[0].SQL, `"custom".processed`) {
		t.Fatalf("migrations: %v %v", ms, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO custom.schema_version (version) VALUES (99)`); err != nil {
		t.Fatal(err)
	}
	if err := inbox.Migrate(ctx, db, "custom"); err == nil || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("migrate under a newer schema: %v", err)
	}
	if _, err := inbox.New(inbox.Config{DB: db, Topics: []string{"t"}, Handler: recording("g")}); err == nil {
		t.Error("a config without a group was accepted")
	}
}

// processed counts group's processed ids.
func (f *fixture) processed(group string) int {
	return f.count(`SELECT count(*) FROM inbox.processed WHERE consumer_group = $1`, group)
}

// bare drains n records of topic bench in group with handler and none of
// the inbox: a transaction per record, the offsets committed after each
// poll. It is the baseline of BenchmarkInbox.
func (f *fixture) bare(group string, n int, handler inbox.Handler) {
	f.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(f.brokers), kgo.ConsumerGroup(group), kgo.ConsumeTopics("bench"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll())
	if err != nil {
		f.t.Fatal(err)
	}
	defer cl.Close()
	for got := 0; got < n; {
		fs := cl.PollRecords(f.ctx, 10_000)
		if err := f.ctx.Err(); err != nil {
			f.t.Fatal(err)
		}
		for _, r := range fs.Records() {
			tx, err := f.db.Begin(f.ctx)
			if err != nil {
				f.t.Fatal(err)
			}
			if err := handler(f.ctx, tx, r); err != nil {
				f.t.Fatal(err)
			}
			if err := tx.Commit(f.ctx); err != nil {
				f.t.Fatal(err)
			}
			got++
		}
		if err := cl.CommitUncommittedOffsets(f.ctx); err != nil {
			f.t.Fatal(err)
		}
		cl.AllowRebalance()
	}
}
