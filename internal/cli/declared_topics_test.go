package cli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// declaredConfig is the test's config file: flags, topic-defaults and
// four declared topics; alt is left to the defaults.
func declaredConfig(retentionMs, deleteRetention string, growPartitions int, extra ...string) string {
	return fmt.Sprintf(`# relay run settings, by flag name
poll-interval: 200ms
batch-size: 20   # many small batches, each a segment of its own
http-addr: 127.0.0.1:1   # the command line's --http-addr wins
listener-super-users: [User:ANONYMOUS]
topic-defaults:
  segment.bytes: 1024
topics:
  ret:
    partitions: 1
    retention.ms: %s
  cmp:
    partitions: 1
    cleanup.policy: compact
    delete.retention.ms: %s
  grow:
    partitions: %d
`, retentionMs, deleteRetention, growPartitions) + strings.Join(extra, "")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDeclaredTopics runs the real binary with a config file and checks
// each promise of the declared topics: settings from the file (the
// command line winning), topic-defaults for a topic the file does not
// list, a retention change by SIGHUP and by AlterConfigs deleting
// segments, moving the log start and the lag-against-retention metric,
// compaction from the file keeping the newest record per key and dropping
// tombstones once older than delete.retention.ms, a bad file refused on
// SIGHUP with its line, and a partition increase refused (kadm, the file,
// relay topics) with a key movement report that matches a count made here
// with franz-go's own partitioner, then done with --allow-repartition.
func TestDeclaredTopics(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr, dataDir := e2e.FreeAddr(t), e2e.FreeAddr(t), e2e.DataDir(t)
	cfgPath := filepath.Join(t.TempDir(), "relay.yaml")
	writeFile(t, cfgPath, declaredConfig("-1", "1h", 4))
	p := e2e.Start(t, bin, nil, "run", "--config", cfgPath, "--database-url", url, "--data-dir", dataDir,
		"--http-addr", httpAddr, "--kafka-addr", kafkaAddr)
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl := kafkaClient(t, kafkaAddr)
	adm := kadm.NewClient(cl)
	conn := pgtest.Connect(t, url)
	exec := func(sql string) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	configs := func(topic string) map[string]string {
		t.Helper()
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rcs.On(topic, nil)
		if err == nil {
			err = rc.Err
		}
		if err != nil {
			t.Fatalf("describe %s: %v", topic, err)
		}
		out := map[string]string{}
		for _, c := range rc.Configs {
			out[c.Key] = c.MaybeValue()
		}
		return out
	}
	start := func(topic string) int64 {
		t.Helper()
		starts, err := adm.ListStartOffsets(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		o, _ := starts.Lookup(topic, 0)
		return o.Offset
	}
	// wantMargin waits for the lag-against-retention metric of group
	// readers (committed at 0) to be minus the topic's log start.
	wantMargin := func(t *testing.T, topic string) {
		t.Helper()
		metric := fmt.Sprintf(`relay_kafka_group_retention_margin_records{group="readers",partition="0",topic="%s"} %d`, topic, -start(topic))
		eventually(t, 10*time.Second, "the lag-against-retention metric", func() error {
			for _, l := range e2e.MetricLines(t, httpAddr) {
				if l == metric {
					return nil
				}
			}
			return fmt.Errorf("no line %q", metric)
		})
	}
	// segments counts a topic's segments on disk, as relay topics reports.
	segments := func(topic string) int {
		t.Helper()
		var ts []struct {
			Name       string `json:"name"`
			Partitions []struct {
				Segments int `json:"segments"`
			} `json:"partitions"`
		}
		relayTopics(t, ctx, bin, dataDir, &ts)
		for _, tp := range ts {
			if tp.Name == topic {
				return tp.Partitions[0].Segments
			}
		}
		t.Fatalf("relay topics lists no %s", topic)
		return 0
	}
	hup := func() {
		t.Helper()
		p.Signal(syscall.SIGHUP)
	}

	if c := configs("cmp"); c["cleanup.policy"] != "compact" || c["segment.bytes"] != "1024" || c["delete.retention.ms"] != "3600000" {
		t.Fatalf("cmp as declared at start: %v", c)
	}

	exec(`INSERT INTO outbox.events (topic, key, payload) SELECT 'ret', 'r' || g, convert_to(repeat('x', 100), 'UTF8') FROM generate_series(1, 200) g`)
	exec(`INSERT INTO outbox.events (topic, key, payload) SELECT 'alt', 'a' || g, convert_to(repeat('x', 100), 'UTF8') FROM generate_series(1, 200) g`)
	for v := 1; v <= 3; v++ {
		exec(fmt.Sprintf(`INSERT INTO outbox.events (topic, key, payload) SELECT 'cmp', 'k' || g, convert_to('v%d', 'UTF8') FROM generate_series(1, 20) g`, v))
		e2e.WaitDrained(t, url, "outbox", time.Minute)
	}
	exec(`INSERT INTO outbox.events (topic, key, payload) SELECT 'cmp', 'k' || g, NULL FROM generate_series(1, 5) g`)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	exec(`INSERT INTO outbox.events (topic, key, payload) SELECT 'cmp', 'f' || g, convert_to(repeat('x', 100), 'UTF8') FROM generate_series(1, 50) g`)
	exec(`INSERT INTO outbox.events (topic, key, payload) SELECT 'grow', 'g' || (g % 150), convert_to('x', 'UTF8') FROM generate_series(1, 300) g`)
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	t.Run("defaults for a topic the file does not list", func(t *testing.T) {
		if c := configs("alt"); c["segment.bytes"] != "1024" || c["cleanup.policy"] != "delete" {
			t.Fatalf("alt, created on first use: %v", c)
		}
	})

	t.Run("retention through the file and SIGHUP", func(t *testing.T) {
		if err := adm.CommitAllOffsets(ctx, "readers", kadm.Offsets{"ret": {0: {At: 0}}, "alt": {0: {At: 0}}}); err != nil {
			t.Fatal(err)
		}
		if s := start("ret"); s != 0 {
			t.Fatalf("ret starts at %d before the change", s)
		}
		before := segments("ret")
		writeFile(t, cfgPath, declaredConfig("1", "1h", 4))
		hup()
		eventually(t, 30*time.Second, "ret's log start after retention.ms=1", func() error {
			if s := start("ret"); s <= 0 {
				return fmt.Errorf("log start %d", s)
			}
			return nil
		})
		wantMargin(t, "ret")
		if after := segments("ret"); after != 1 || before < 5 {
			t.Fatalf("ret had %d segments, %d after retention.ms=1 (want only the active one left)", before, after)
		}
		if c := configs("ret"); c["retention.ms"] != "1" {
			t.Fatalf("ret after SIGHUP: %v", c)
		}
	})

	t.Run("retention through AlterConfigs", func(t *testing.T) {
		resps, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "retention.bytes", Value: kadm.StringPtr("2048")}}, "alt")
		if err == nil {
			for _, r := range resps {
				err = errors.Join(err, r.Err)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "alt's log start after retention.bytes=2048", func() error {
			if s := start("alt"); s <= 0 {
				return fmt.Errorf("log start %d", s)
			}
			return nil
		})
		wantMargin(t, "alt")
	})

	cmpRecords := func() map[string][]*kgo.Record {
		byKey := map[string][]*kgo.Record{}
		for _, r := range kafkatest.ReadRecords(t, []string{kafkaAddr}, "cmp", false) {
			byKey[string(r.Key)] = append(byKey[string(r.Key)], r)
		}
		return byKey
	}
	t.Run("compaction from the file", func(t *testing.T) {
		// The SIGHUP above ran a pass: tombstones younger than an hour stay.
		eventually(t, 30*time.Second, "compacted cmp", func() error {
			byKey := cmpRecords()
			for k := 1; k <= 20; k++ {
				rs := byKey[fmt.Sprintf("k%d", k)]
				if len(rs) != 1 {
					return fmt.Errorf("key k%d has %d records", k, len(rs))
				}
				if k <= 5 && rs[0].Value != nil || k > 5 && string(rs[0].Value) != "v3" {
					return fmt.Errorf("key k%d: value %q, want the newest", k, rs[0].Value)
				}
			}
			return nil
		})
		writeFile(t, cfgPath, declaredConfig("1", "1", 4))
		hup()
		eventually(t, 30*time.Second, "tombstones past delete.retention.ms", func() error {
			byKey := cmpRecords()
			for k := 1; k <= 20; k++ {
				rs := byKey[fmt.Sprintf("k%d", k)]
				if k <= 5 && len(rs) != 0 {
					return fmt.Errorf("tombstone of k%d still there", k)
				}
				if k > 5 && (len(rs) != 1 || string(rs[0].Value) != "v3") {
					return fmt.Errorf("key k%d: %d records", k, len(rs))
				}
			}
			if n := len(byKey); n != 15+50 {
				return fmt.Errorf("%d keys, want 65", n)
			}
			return nil
		})
	})

	t.Run("a bad file on SIGHUP", func(t *testing.T) {
		writeFile(t, cfgPath, declaredConfig("1", "1", 4)+"    segment.bytes: lots\n")
		hup()
		eventually(t, 10*time.Second, "the refusal in the log", func() error {
			if out := p.Output(); !strings.Contains(out, "relay.yaml:18") || !strings.Contains(out, "running configuration stays") {
				return errors.New("not logged")
			}
			return nil
		})
		if c := configs("grow"); c["segment.bytes"] != "1024" {
			t.Fatalf("grow after a refused file: %v", c)
		}
	})

	t.Run("partition increase", func(t *testing.T) {
		keys := map[string]bool{}
		for _, r := range kafkatest.ReadRecords(t, []string{kafkaAddr}, "grow", false) {
			keys[string(r.Key)] = true
		}
		want := keyMovement("grow", keys, 4, 8)
		t.Logf("independent count: %s", want)

		resps, err := adm.UpdatePartitions(ctx, 8, "grow")
		if err != nil {
			t.Fatal(err)
		}
		if r := resps["grow"]; !errors.Is(r.Err, kerr.PolicyViolation) || !strings.Contains(r.ErrMessage, want) {
			t.Fatalf("CreatePartitions without --allow-repartition: %v %q; want POLICY_VIOLATION and %q", r.Err, r.ErrMessage, want)
		}
		resps, err = adm.UpdatePartitions(ctx, 2, "grow")
		if err != nil || !errors.Is(resps["grow"].Err, kerr.InvalidPartitions) {
			t.Fatalf("a decrease: %v %+v; want INVALID_PARTITIONS", err, resps)
		}

		writeFile(t, cfgPath, declaredConfig("1", "1", 8))
		hup()
		eventually(t, 10*time.Second, "the file's increase refused", func() error {
			if out := p.Output(); !strings.Contains(out, want) || !strings.Contains(out, "declared topics refused") {
				return errors.New("not logged")
			}
			return nil
		})

		r, err := testbin.Run(ctx, bin, nil, "topics", "alter", "grow", "--partitions", "8", "--data-dir", dataDir)
		if err != nil || r.Code != 1 || !strings.Contains(r.Stdout, want) {
			t.Fatalf("relay topics alter without --allow-repartition: %v, exit %d\n%s\n%s", err, r.Code, r.Stdout, r.Stderr)
		}
		r, err = testbin.Run(ctx, bin, nil, "topics", "alter", "grow", "--partitions", "8", "--allow-repartition", "--data-dir", dataDir)
		if err != nil || r.Code != 0 || !strings.Contains(r.Stdout, "through the running relay") {
			t.Fatalf("relay topics alter --allow-repartition: %v, exit %d\n%s\n%s", err, r.Code, r.Stdout, r.Stderr)
		}
		r, err = testbin.Run(ctx, bin, nil, "topics", "describe", "grow", "--data-dir", dataDir)
		if err != nil || !strings.Contains(r.Stdout, "grow: 8 partitions") {
			t.Fatalf("relay topics describe: %v\n%s\n%s", err, r.Stdout, r.Stderr)
		}
		// Confirmed in the file, on the topic: done on SIGHUP.
		writeFile(t, cfgPath, declaredConfig("1", "1", 12, "    allow-repartition: true\nshutdown-timeout: 5s\n"))
		hup()
		eventually(t, 10*time.Second, "the warning about a setting that needs a restart", func() error {
			if out := p.Output(); !strings.Contains(out, "take effect at the next start") || !strings.Contains(out, "settings=[shutdown-timeout]") {
				return errors.New("not logged")
			}
			return nil
		})
		eventually(t, 10*time.Second, "12 partitions from the file", func() error {
			ts, err := adm.ListTopics(ctx, "grow")
			if err != nil {
				return err
			}
			if n := len(ts["grow"].Partitions); n != 12 {
				return fmt.Errorf("%d partitions", n)
			}
			return nil
		})
		// The relay places new events by the new count.
		part := kgo.StickyKeyPartitioner(nil).ForTopic("grow")
		var key string
		for k := range keys {
			if part.Partition(&kgo.Record{Key: []byte(k)}, 4) != part.Partition(&kgo.Record{Key: []byte(k)}, 12) {
				key = k
				break
			}
		}
		exec(fmt.Sprintf(`INSERT INTO outbox.events (topic, key, payload) VALUES ('grow', '%s', convert_to('after', 'UTF8'))`, key))
		e2e.WaitDrained(t, url, "outbox", time.Minute)
		found := false
		for _, rec := range kafkatest.ReadRecords(t, []string{kafkaAddr}, "grow", false) {
			if bytes.Equal(rec.Value, []byte("after")) {
				found = true
				if int(rec.Partition) != part.Partition(rec, 12) {
					t.Fatalf("key %s published to partition %d after the increase, want %d", key, rec.Partition, part.Partition(rec, 12))
				}
			}
		}
		if !found {
			t.Fatal("the event published after the increase was not read back")
		}
	})

	t.Run("admin APIs on the binary", func(t *testing.T) {
		dirs, err := adm.DescribeAllLogDirs(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		var size int64 = -1
		dirs.Each(func(d kadm.DescribedLogDir) {
			if p, ok := d.Topics.Lookup("cmp", 0); ok {
				size = p.Size
			}
		})
		if size <= 0 {
			t.Fatalf("DescribeLogDirs: cmp/0 has %d bytes", size)
		}
		ends, err := adm.ListEndOffsets(ctx, "cmp")
		if err != nil {
			t.Fatal(err)
		}
		end, _ := ends.Lookup("cmp", 0)
		dr, err := adm.DeleteRecords(ctx, kadm.Offsets{"cmp": {0: {At: end.Offset}}})
		if err != nil || dr["cmp"][0].Err != nil || dr["cmp"][0].LowWatermark != end.Offset || start("cmp") != end.Offset {
			t.Fatalf("DeleteRecords up to %d: %v %+v, start %d", end.Offset, err, dr, start("cmp"))
		}
		if r, err := adm.DeleteGroups(ctx, "readers"); err != nil || r["readers"].Err != nil {
			t.Fatalf("DeleteGroups: %v %+v", err, r)
		}
		eventually(t, 10*time.Second, "the deleted group's metrics gone", func() error {
			for _, l := range e2e.MetricLines(t, httpAddr) {
				if strings.Contains(l, `group="readers"`) {
					return fmt.Errorf("still exported: %s", l)
				}
			}
			return nil
		})
	})

	t.Run("deleting a topic the relay publishes to", func(t *testing.T) {
		r, err := testbin.Run(ctx, bin, nil, "topics", "delete", "alt", "--data-dir", dataDir)
		if err != nil || r.Code != 0 {
			t.Fatalf("relay topics delete: %v, exit %d\n%s\n%s", err, r.Code, r.Stdout, r.Stderr)
		}
		exec(`INSERT INTO outbox.events (topic, key, payload) VALUES ('alt', 'again', convert_to('after', 'UTF8'))`)
		e2e.WaitDrained(t, url, "outbox", time.Minute)
		recs := kafkatest.ReadRecords(t, []string{kafkaAddr}, "alt", false)
		if len(recs) != 1 || string(recs[0].Value) != "after" {
			t.Fatalf("alt after its deletion and a new event: %d records", len(recs))
		}
	})

	t.Run("a decrease in the file at start", func(t *testing.T) {
		p.Stop(30 * time.Second)
		writeFile(t, cfgPath, declaredConfig("1", "1", 6))
		p2 := e2e.Start(t, bin, nil, "run", "--config", cfgPath, "--database-url", url, "--data-dir", dataDir,
			"--http-addr", httpAddr, "--kafka-addr", kafkaAddr)
		eventually(t, 30*time.Second, "not ready, naming the refusal", func() error {
			if r := p2.ReadyReason(); !strings.Contains(r, "never lowered") || !strings.Contains(r, "relay.yaml:17") {
				return fmt.Errorf("readyz reason %q", r)
			}
			return nil
		})
	})
}

// TestBadConfigFileRefusedAtStart: relay run names the file, the line
// and the reason, and exits 2, before connecting anywhere.
func TestBadConfigFileRefusedAtStart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	cases := []struct{ name, file, want string }{
		{"unknown flag", "poll-interval: 1s\nno-such-flag: 3\n", "relay.yaml:2: unknown setting \"no-such-flag\""},
		{"bad flag value", "\nbatch-size: many\n", "relay.yaml:2: batch-size: "},
		{"unknown topic config", "topics:\n  orders:\n    retention.hours: 3\n", "relay.yaml:3: unknown topic config \"retention.hours\""},
		{"bad policy", "topics:\n  orders:\n    cleanup.policy: archive\n", "relay.yaml:3: "},
		{"invalid topic", "topics:\n  orders:\n    segment.bytes: 10\n", "relay.yaml:2: topic orders: "},
		{"YAML syntax", "topics:\n  orders: [\n", "relay.yaml"},
	}
	for _, c := range cases {
		path := filepath.Join(dir, "relay.yaml")
		writeFile(t, path, c.file)
		r, err := testbin.Run(ctx, testbin.Relay(t), nil, "run", "--config", path, "--database-url", "postgres://127.0.0.1:1/none")
		if err != nil || r.Code != 2 || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%s: %v, exit %d, stderr %q; want exit 2 and %q", c.name, err, r.Code, r.Stderr, c.want)
		}
	}
}
