package cli_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// kafkaClient is a franz-go client of the Kafka listener at addr, with
// opts; it is closed when the test ends.
func kafkaClient(t *testing.T, addr string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addr)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// kcatPath is the path of kcat, which the Kafka interop tests need.
func kcatPath(t *testing.T) string {
	t.Helper()
	kcat, err := exec.LookPath("kcat")
	if err != nil {
		t.Fatal("kcat is required for Kafka interop tests (apt-get install kcat; .ci/run installs it)")
	}
	return kcat
}

// TestKcatReadsOutboxEvents: events the poller publishes are read through
// `relay run`'s Kafka listener by kcat (librdkafka), with their keys,
// values, headers and Kafka's partitions.
func TestKcatReadsOutboxEvents(t *testing.T) {
	t.Parallel()
	kcat := kcatPath(t)
	url := pgtest.NewDatabase(t)
	bin := testbin.Relay(t)
	if r := relay(t, nil, "migrate", "up", "--database-url", url); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	conn := pgtest.Connect(t, url)
	ctx := context.Background()
	const keys, perKey = 20, 5
	for i := 0; i < perKey; i++ {
		for k := 0; k < keys; k++ {
			_, err := conn.Exec(ctx, `SELECT outbox.emit('orders', $1, $2::text, $3::jsonb)`,
				fmt.Sprintf("key-%d", k), fmt.Sprintf("value-%d-%d", k, i), fmt.Sprintf(`{"trace-id":"t-%d-%d"}`, k, i))
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	addr := e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", e2e.DataDir(t), "--http-addr", e2e.FreeAddr(t),
		"--kafka-addr", addr, "--partitions", "4")
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	cmd := exec.Command(kcat, "-b", addr, "-C", "-t", "orders", "-o", "beginning", "-e", "-q", "-f", "%p|%k|%s|%h\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kcat: %v\n%s", err, out)
	}
	next := map[string]int{}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(line, "|", 4)
		if len(f) != 4 {
			t.Fatalf("unexpected kcat line %q", line)
		}
		var part int32
		fmt.Sscan(f[0], &part)
		key, value, headers := f[1], f[2], f[3]
		if want := broker.PartitionForKey([]byte(key), 4); part != want {
			t.Fatalf("key %s on partition %d, Kafka's partitioner says %d", key, part, want)
		}
		var k, i int
		if _, err := fmt.Sscanf(value, "value-%d-%d", &k, &i); err != nil || key != fmt.Sprintf("key-%d", k) {
			t.Fatalf("record %q has key %q", value, key)
		}
		if i != next[key] {
			t.Fatalf("key %s: got event %d, want %d (per-key order)", key, i, next[key])
		}
		next[key]++
		if !strings.Contains(headers, fmt.Sprintf("trace-id=t-%d-%d", k, i)) || !strings.Contains(headers, "relay-event-id=") {
			t.Fatalf("record %s headers = %q", value, headers)
		}
		n++
	}
	if n != keys*perKey {
		t.Fatalf("kcat read %d records, want %d:\n%s", n, keys*perKey, out)
	}
	p.Stop(30 * time.Second)
}
