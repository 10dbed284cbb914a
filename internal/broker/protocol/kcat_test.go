package protocol

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
)

func runKcat(t *testing.T, ctx context.Context, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, kcatPath(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kcat %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// tryKcat runs kcat (for at most 20 s) and returns its combined output
// and error, for runs that may fail.
func tryKcat(t testing.TB, ctx context.Context, stdin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kcatPath(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestKcatMetadataProduceConsume(t *testing.T) {
	t.Parallel()
	const topic, parts = "kcat-orders", 4
	f, ctx := setupTopic(t, topic, parts, 90*time.Second)

	md := runKcat(t, ctx, "", "-b", f.addr, "-L")
	for _, want := range []string{"1 brokers:", "broker 0 at " + f.addr, fmt.Sprintf("topic \"%s\" with %d partitions", topic, parts)} {
		if !strings.Contains(md, want) {
			t.Errorf("kcat -L output lacks %q:\n%s", want, md)
		}
	}

	var in strings.Builder
	want := map[string]string{}
	for i := range 40 {
		k, v := fmt.Sprintf("order-%d", i), fmt.Sprintf(`{"n":%d}`, i)
		fmt.Fprintf(&in, "%s:%s\n", k, v)
		want[k] = v
	}
	// librdkafka hashes keys with CRC32 unless told to use Kafka's murmur2.
	runKcat(t, ctx, in.String(), "-b", f.addr, "-P", "-t", topic, "-K:", "-X", "enable.idempotence=true", "-X", "partitioner=murmur2_random")

	out := runKcat(t, ctx, "", "-b", f.addr, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%k|%s|%p\n")
	got := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		fields := strings.Split(line, "|")
		if len(fields) != 3 {
			t.Fatalf("bad kcat line %q", line)
		}
		k, v, p := fields[0], fields[1], fields[2]
		got[k] = v
		if wantP := broker.PartitionForKey([]byte(k), parts); p != fmt.Sprint(wantP) {
			t.Errorf("key %s on partition %s, want %d (murmur2)", k, p, wantP)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("consumed %d records, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("key %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestKcatGroupConsume(t *testing.T) {
	t.Parallel()
	const topic, group = "kcat-group", "kcat-consumers"
	f, ctx := setupTopic(t, topic, 3, 90*time.Second)
	var in strings.Builder
	for i := range 30 {
		fmt.Fprintf(&in, "k%d:v%d\n", i, i)
	}
	runKcat(t, ctx, in.String(), "-b", f.addr, "-P", "-t", topic, "-K:")

	// A balanced group consumer reads everything, commits, and exits at
	// the end of the partitions (-e).
	out := runKcat(t, ctx, "", "-b", f.addr, "-G", group, "-o", "beginning", "-e", "-q", "-f", "%k=%s\n",
		"-X", "auto.commit.interval.ms=100", "-X", "session.timeout.ms=6000", topic)
	lines := strings.Fields(out)
	sort.Strings(lines)
	if len(lines) != 30 {
		t.Fatalf("group consumed %d records, want 30:\n%s", len(lines), out)
	}
	var committed int64
	for p := int32(0); p < 3; p++ {
		if c, ok := f.b.FetchOffset(group, topic, p); ok {
			committed += c.Offset
		}
	}
	if committed != 30 {
		t.Errorf("group committed offsets summing to %d, want 30", committed)
	}
}
