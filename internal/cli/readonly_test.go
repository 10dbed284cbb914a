package cli_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// noCrash fails the test when a command's stderr shows a Go panic or the
// CLI's guard against one: the guard is the last line, not the fix.
func noCrash(t *testing.T, what string, r testbin.Result) {
	t.Helper()
	for _, bad := range []string{"panic:", "goroutine ", "internal error in"} {
		if strings.Contains(r.Stderr, bad) {
			t.Fatalf("%s: crashed (exit %d):\n%s", what, r.Code, r.Stderr)
		}
	}
}

// oneLineFailure checks that a command refused its input with one line on
// stderr and a non-zero exit.
func oneLineFailure(t *testing.T, what string, r testbin.Result) {
	t.Helper()
	noCrash(t, what, r)
	if r.Code == 0 || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || strings.TrimSpace(r.Stderr) == "" {
		t.Fatalf("%s: exit %d, stderr %q; want one line and a non-zero exit", what, r.Code, r.Stderr)
	}
}

// succeeds runs the relay with args and checks exit 0, some output and no
// crash; it returns stdout.
func succeeds(t *testing.T, args ...string) string {
	t.Helper()
	r := relay(t, nil, args...)
	what := "relay " + strings.Join(args, " ")
	noCrash(t, what, r)
	if r.Code != 0 || strings.TrimSpace(r.Stdout) == "" {
		t.Fatalf("%s: exit %d, stdout %q, stderr %q", what, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// committed is what `relay groups --json` says of one group on a topic.
type committed struct {
	sum, lag   int64
	partitions int
}

func groupsOn(t *testing.T, dataDir, kafkaAddr, topic string) map[string]committed {
	t.Helper()
	var gs []groupJSON
	if err := json.Unmarshal([]byte(succeeds(t, "groups", "--json", "--data-dir", dataDir, "--kafka-addr", kafkaAddr)), &gs); err != nil {
		t.Fatal(err)
	}
	out := map[string]committed{}
	for _, g := range gs {
		c := out[g.Group]
		for _, p := range g.Partitions {
			if p.Topic == topic {
				c.sum, c.lag, c.partitions = c.sum+p.Committed, c.lag+p.Lag, c.partitions+1
			}
		}
		out[g.Group] = c
	}
	return out
}

type groupJSON struct {
	Group      string `json:"group"`
	Partitions []struct {
		Topic     string `json:"topic"`
		Partition int32  `json:"partition"`
		Committed int64  `json:"committed"`
		Lag       int64  `json:"lag"`
	} `json:"partitions"`
}

// consumeAndCommit reads n records of topic in a franz-go group member
// (KIP-848's protocol when nextGen), commits and leaves.
func consumeAndCommit(t *testing.T, ctx context.Context, addr, group, topic string, n int, nextGen bool) {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(addr), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit()}
	if nextGen {
		opts = append(opts, kgo.ServerSideBalancer(), kgo.Balancers(kgo.RangeBalancer()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("group %s: read %d of %d records: %v", group, got, n, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("group %s: fetch: %v", group, err) })
		got += fs.NumRecords()
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("group %s: commit: %v", group, err)
	}
}

// leftovers runs a relay and leaves behind what the end-to-end tests do:
// 100 events of orders in 4 partitions read by a classic group of kcat
// (librdkafka), a classic and a KIP-848 group of franz-go, all committed; a
// transactional producer's commit and abort; a compacted topic with
// tombstones; dead letters in the database. It returns the database URL,
// the data directory, the running relay and its addresses.
func leftovers(t *testing.T, ctx context.Context) (url, dataDir string, p *e2e.Proc, kafkaAddr, httpAddr string) {
	t.Helper()
	kcat := kcatPath(t)
	url, bin := e2e.Migrated(t)
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT CASE WHEN g % 25 = 0 THEN 'bad topic!' ELSE 'orders' END, 'k' || (g % 10), convert_to('v' || g, 'UTF8') FROM generate_series(1, 104) AS g`); err != nil {
		t.Fatal(err)
	}
	kafkaAddr, httpAddr, dataDir = e2e.FreeAddr(t), e2e.FreeAddr(t), e2e.DataDir(t)
	p = e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", dataDir, "--http-addr", httpAddr,
		"--kafka-addr", kafkaAddr, "--poll-interval", "100ms", "--partitions", "4", "--listener-writable-topics", "prices,ledger")
	e2e.WaitReady(t, p, true, time.Minute)
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	adm := kadm.NewClient(kafkaClient(t, kafkaAddr))
	compact := "compact"
	for _, c := range []struct {
		topic string
		cfg   map[string]*string
	}{{"prices", map[string]*string{"cleanup.policy": &compact}}, {"ledger", nil}} {
		created, err := adm.CreateTopics(ctx, 2, 1, c.cfg, c.topic)
		if err == nil {
			err = created.Error()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	prod := kafkaClient(t, kafkaAddr)
	var recs []*kgo.Record
	for i := range 20 {
		recs = append(recs, &kgo.Record{Topic: "prices", Key: []byte(fmt.Sprint("sku-", i%5)), Value: []byte(fmt.Sprint(i))})
	}
	for i := range 2 {
		recs = append(recs, &kgo.Record{Topic: "prices", Key: []byte(fmt.Sprint("sku-", i))}) // tombstones
	}
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	tx := kafkaClient(t, kafkaAddr, kgo.TransactionalID("readonly-tx"), kgo.DefaultProduceTopic("ledger"))
	for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := tx.ProduceSync(ctx, &kgo.Record{Key: []byte("a"), Value: []byte(fmt.Sprint(commit))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := tx.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}

	// The bug's repro: kcat as a classic group member, committing.
	kctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(kctx, kcat, "-b", kafkaAddr, "-G", "g-kcat", "-o", "beginning", "-e", "-q", "orders").CombinedOutput(); err != nil {
		t.Fatalf("kcat -G: %v\n%s", err, out)
	}
	consumeAndCommit(t, kctx, kafkaAddr, "g-franz-classic", "orders", 100, false)
	consumeAndCommit(t, kctx, kafkaAddr, "g-franz-848", "orders", 100, true)
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, g := range listed.Sorted() {
		types[g.Group] = g.GroupType
	}
	if types["g-kcat"] != "classic" || types["g-franz-classic"] != "classic" || types["g-franz-848"] != "consumer" {
		t.Fatalf("group types %v: want kcat's and franz-go's classic, franz-go's KIP-848 (consumer)", types)
	}
	return url, dataDir, p, kafkaAddr, httpAddr
}

// TestReadOnlyCommandsOnLeftovers runs every read-only command on the data
// directory and database a relay run leaves (see leftovers), while the
// relay runs, after it stopped, and once a segment is damaged. `relay
// topics` and `relay groups` once panicked (index out of range [-1]) as
// soon as a consumer group had committed.
func TestReadOnlyCommandsOnLeftovers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url, dataDir, p, kafkaAddr, httpAddr := leftovers(t, ctx)
	schemas := t.TempDir()
	if err := os.WriteFile(filepath.Join(schemas, "orders-value.json"), []byte(`{"type":"object","properties":{"id":{"type":"string"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	all := func(when string) {
		t.Run(when, func(t *testing.T) {
			// The groups' commits are fsynced; the log's last second
			// may still be in the running broker's memory.
			eventually(t, 10*time.Second, "groups", func() error {
				got := groupsOn(t, dataDir, kafkaAddr, "orders")
				for _, g := range []string{"g-kcat", "g-franz-classic", "g-franz-848"} {
					if c := got[g]; c.sum != 100 || c.lag != 0 {
						return fmt.Errorf("group %s: committed %d records in %d partitions of orders, lag %d; want 100, lag 0 (%+v)",
							g, c.sum, c.partitions, c.lag, got)
					}
				}
				return nil
			})
			out := succeeds(t, "groups", "--data-dir", dataDir, "--kafka-addr", kafkaAddr)
			for _, want := range []string{"group g-kcat", "group g-franz-classic", "group g-franz-848", "orders"} {
				if !strings.Contains(out, want) {
					t.Errorf("relay groups lacks %q:\n%s", want, out)
				}
			}
			var topics []topicJSON
			if err := json.Unmarshal([]byte(succeeds(t, "topics", "--json", "--data-dir", dataDir)), &topics); err != nil {
				t.Fatal(err)
			}
			names := map[string]string{}
			for _, tp := range topics {
				names[tp.Name] = tp.CleanupPolicy
			}
			if names["orders"] != "delete" || names["prices"] != "compact" || names["ledger"] == "" {
				t.Errorf("relay topics --json: %+v", names)
			}
			if out := succeeds(t, "topics", "--data-dir", dataDir); !strings.Contains(out, "prices") {
				t.Errorf("relay topics:\n%s", out)
			}
			dump := succeeds(t, "log", "dump", "--data-dir", dataDir, "--format", "json", "--topic", "ledger")
			if !strings.Contains(dump, `"control":"commit"`) || !strings.Contains(dump, `"control":"abort"`) {
				t.Errorf("log dump of the transactional topic lacks its markers:\n%s", dump)
			}
			succeeds(t, "log", "dump", "--data-dir", dataDir)
			if dump := succeeds(t, "log", "dump", "--data-dir", dataDir, "--format", "json", "--topic", "prices"); strings.Count(dump, `"value":null`) != 2 {
				t.Errorf("log dump of the compacted topic: want its 2 tombstones:\n%s", dump)
			}
			var dls []deadLetterJSON
			if err := json.Unmarshal([]byte(succeeds(t, "dead-letters", "list", "--json", "--database-url", url)), &dls); err != nil || len(dls) != 4 {
				t.Errorf("dead-letters list --json: %d dead letters, %v; want 4", len(dls), err)
			}
			succeeds(t, "dead-letters", "list", "--database-url", url)
			succeeds(t, "dead-letters", "show", "--database-url", url, fmt.Sprint(dls[0].ID))
			succeeds(t, "status", "--database-url", url, "--http-addr", httpAddr)
			succeeds(t, "status", "--json", "--database-url", url, "--http-addr", httpAddr)
			succeeds(t, "schema", "check", "--dir", schemas, "--database-url", url)
			succeeds(t, "migrate", "status", "--database-url", url)
		})
	}
	all("relay running")
	p.Stop(30 * time.Second)
	all("relay stopped")

	// Damage the first batch of the transactional topic's partition,
	// which good batches follow: damage, not a torn tail.
	victim, at := firstOfSeveralBatches(t, dataDir, "ledger")
	f, err := os.OpenFile(victim, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{0}
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[0] ^ 0xff}, at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, args := range [][]string{
		{"topics", "--data-dir", dataDir}, {"topics", "--json", "--data-dir", dataDir},
		{"groups", "--data-dir", dataDir, "--kafka-addr", ""},
		{"log", "dump", "--data-dir", dataDir, "--topic", "orders", "--format", "json"},
	} {
		succeeds(t, args...)
	}
	for _, args := range [][]string{
		{"log", "dump", "--data-dir", dataDir}, {"log", "dump", "--data-dir", dataDir, "--topic", "ledger", "--format", "json"},
	} {
		r := relay(t, nil, args...)
		oneLineFailure(t, "damaged: relay "+strings.Join(args, " "), r)
		if !strings.Contains(r.Stderr, "damaged batch") {
			t.Errorf("relay %s: %q names no damage", strings.Join(args, " "), r.Stderr)
		}
	}
}

// firstOfSeveralBatches returns the segment of a partition of topic that
// holds more than one batch, and the position of the last byte of its
// first batch.
func firstOfSeveralBatches(t *testing.T, dataDir, topic string) (string, int64) {
	t.Helper()
	segs, _ := filepath.Glob(filepath.Join(dataDir, "topics", topic, "*", "*.log"))
	for _, seg := range segs {
		data, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) < 12 {
			continue
		}
		first := 12 + int64(binary.BigEndian.Uint32(data[8:12]))
		if first+61 <= int64(len(data)) {
			return seg, first - 1
		}
	}
	t.Fatalf("no segment of %s holds two batches: %v", topic, segs)
	return "", 0
}

type topicJSON struct {
	Name          string `json:"name"`
	CleanupPolicy string `json:"cleanup_policy"`
}

// TestReadOnlyCommandsOnGarbage points the read-only commands at what is
// not a relay's data directory or database: each refuses in one line with
// a non-zero exit, and a database password never shows.
func TestReadOnlyCommandsOnGarbage(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(path string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	noise := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7919 + i/3)
		}
		return b
	}
	const meta = `{"version":1,"topics":{"orders":{"partitions":2,"retention_ms":-1,"retention_bytes":-1,"cleanup_policy":"delete"}}}`
	dirs := map[string]string{
		"a nonexistent data dir":           filepath.Join(root, "nope"),
		"a file":                           filepath.Join(root, "file"),
		"random files":                     filepath.Join(root, "random"),
		"an empty meta.json":               filepath.Join(root, "empty-meta"),
		"a meta.json of noise":             filepath.Join(root, "noise-meta"),
		"a meta.json of 2^31-1 partitions": filepath.Join(root, "huge-meta"),
		"a topic named ../..":              filepath.Join(root, "escape-meta"),
	}
	write(dirs["a file"], noise(100))
	for _, name := range []string{"topics", "groups", "x.log", "00000000000000000000.log"} {
		write(filepath.Join(dirs["random files"], name), noise(300))
	}
	write(filepath.Join(dirs["an empty meta.json"], "meta.json"), nil)
	write(filepath.Join(dirs["a meta.json of noise"], "meta.json"), noise(64))
	write(filepath.Join(dirs["a meta.json of 2^31-1 partitions"], "meta.json"), []byte(`{"topics":{"orders":{"partitions":2147483647}}}`))
	write(filepath.Join(dirs["a topic named ../.."], "meta.json"), []byte(`{"topics":{"../..":{"partitions":1}}}`))
	for what, dir := range dirs {
		for _, args := range [][]string{
			{"topics", "--data-dir", dir}, {"groups", "--json", "--data-dir", dir, "--kafka-addr", ""},
		} {
			oneLineFailure(t, what+": relay "+strings.Join(args, " "), relay(t, nil, args...))
		}
		if what == "a meta.json of 2^31-1 partitions" || what == "a topic named ../.." || what == "an empty meta.json" || what == "a meta.json of noise" {
			continue // log dump reads the topics directory, not meta.json
		}
		oneLineFailure(t, what+": relay log dump", relay(t, nil, "log", "dump", "--data-dir", dir))
	}

	// Truncated and noisy group offsets: what precedes the first bad
	// frame is a commit being written or a torn tail (a crash mid-write),
	// which the broker's next open cuts off. The groups before it show.
	good := filepath.Join(root, "torn-offsets")
	write(filepath.Join(good, "meta.json"), []byte(meta))
	write(filepath.Join(good, "groups", "offsets.log"), noise(50))
	if out := succeeds(t, "groups", "--data-dir", good, "--kafka-addr", ""); !strings.Contains(out, "no consumer groups") ||
		!strings.Contains(out, "the last 50 bytes of groups/offsets.log are no valid commit") {
		t.Errorf("groups on an offsets file of noise: %q", out)
	}
	succeeds(t, "topics", "--data-dir", good)

	schemas := t.TempDir()
	write(filepath.Join(schemas, "orders-value.json"), []byte(`{"type":"object"}`))
	for _, url := range []string{
		"postgres://relay:hunter2@127.0.0.1:1/relay",
		"not a url",
		"postgres://relay:hunter2@127.0.0.1:1/relay?sslmode=bogus",
	} {
		for _, cmd := range [][]string{
			{"status", "--http-addr", ""}, {"dead-letters", "list", "--json"}, {"dead-letters", "show"},
			{"schema", "check", "--dir", schemas}, {"migrate", "status"},
		} {
			args := append(append([]string{}, cmd...), "--database-url", url)
			if cmd[1] == "show" {
				args = append(args, "1")
			}
			r := relay(t, nil, args...)
			oneLineFailure(t, "relay "+strings.Join(args, " "), r)
			if strings.Contains(r.Stdout+r.Stderr, "hunter2") {
				t.Errorf("relay %s shows the password: %s", strings.Join(args, " "), r.Stdout+r.Stderr)
			}
		}
	}
}
