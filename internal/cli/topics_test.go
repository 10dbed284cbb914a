package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// relayTopics runs `relay topics --json` (bin) on the data directory
// dataDir and decodes what it prints into v.
func relayTopics(t *testing.T, ctx context.Context, bin, dataDir string, v any) {
	t.Helper()
	r, err := testbin.Run(ctx, bin, nil, "topics", "--json", "--data-dir", dataDir)
	if err != nil || r.Code != 0 {
		t.Fatalf("relay topics: %v, exit %d: %s", err, r.Code, r.Stderr)
	}
	if err := json.Unmarshal([]byte(r.Stdout), v); err != nil {
		t.Fatalf("relay topics --json: %v\n%s", err, r.Stdout)
	}
}

// TestHotPartitions: 1,000 events into a 4-partition topic, 700 of them
// under one key. The per-partition append metrics and the SKEW column of
// `relay topics` must agree with a count of the records a Kafka consumer
// reads back from each partition.
func TestHotPartitions(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	httpAddr, kafkaAddr, dataDir := e2e.FreeAddr(t), e2e.FreeAddr(t), e2e.DataDir(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", dataDir, "--http-addr", httpAddr,
		"--kafka-addr", kafkaAddr, "--poll-interval", "200ms")
	e2e.WaitReady(t, p, true, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl := kafkaClient(t, kafkaAddr)
	const partitions = 4
	created, err := kadm.NewClient(cl).CreateTopics(ctx, partitions, 1, nil, "hot")
	if err == nil {
		err = created.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Connect(t, url)
	if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT 'hot', CASE WHEN g <= 700 THEN 'the-hot-key' ELSE 'k' || g END, 'v' FROM generate_series(1, 1000) AS g`); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	count := make([]int, partitions)
	for _, r := range kafkatest.Read(t, []string{kafkaAddr}, "hot", false) {
		count[r.Partition]++
	}
	var total int
	for _, n := range count {
		total += n
	}
	if total != 1000 {
		t.Fatalf("read back %d records, want 1000", total)
	}
	t.Logf("records per partition: %v", count)

	metrics := map[string]float64{}
	for _, line := range e2e.MetricLines(t, httpAddr) {
		for part := range partitions {
			prefix := fmt.Sprintf(`relay_broker_partition_records_appended_total{partition="%d",topic="hot"} `, part)
			if v, ok := strings.CutPrefix(line, prefix); ok {
				var f float64
				fmt.Sscan(v, &f)
				metrics[fmt.Sprint(part)] = f
			}
		}
	}
	for part, n := range count {
		if got := metrics[fmt.Sprint(part)]; got != float64(n) {
			t.Errorf("partition %d: relay_broker_partition_records_appended_total %v, the consumer read %d", part, got, n)
		}
	}

	var topics []struct {
		Name       string `json:"name"`
		Partitions []struct {
			Partition int32   `json:"partition"`
			Skew      float64 `json:"skew"`
		} `json:"partitions"`
	}
	// relay topics reads the files, which a running relay's broker
	// writes within about a second of the append (write-back).
	var wrong []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		topics = nil
		relayTopics(t, ctx, testbin.Relay(t), dataDir, &topics)
		wrong = []string{"relay topics lists no topic hot"}
		for _, tp := range topics {
			if tp.Name != "hot" {
				continue
			}
			wrong = nil
			for _, pj := range tp.Partitions {
				want := float64(count[pj.Partition]) * partitions / float64(total)
				if math.Abs(pj.Skew-want) > 1e-9 {
					wrong = append(wrong, fmt.Sprintf("partition %d: skew %v, want %v", pj.Partition, pj.Skew, want))
				}
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // condition poll
	}
	if len(wrong) > 0 {
		t.Fatalf("%s (%+v)", strings.Join(wrong, "; "), topics)
	}
	table, err := testbin.Run(ctx, testbin.Relay(t), nil, "topics", "--data-dir", dataDir)
	if err != nil || !strings.Contains(table.Stdout, "SKEW") {
		t.Fatalf("relay topics: %v\n%s", err, table.Stdout)
	}
}
