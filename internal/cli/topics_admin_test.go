package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/testbin"
)

// keyMovement is the report a partition increase of topic from `from` to
// `to` partitions must give for keys, counted independently of the relay
// with franz-go's partitioner (Kafka's default: murmur2 of the key).
func keyMovement(topic string, keys map[string]bool, from, to int) string {
	part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	moving := 0
	for k := range keys {
		if part.Partition(&kgo.Record{Key: []byte(k)}, from) != part.Partition(&kgo.Record{Key: []byte(k)}, to) {
			moving++
		}
	}
	return fmt.Sprintf("moves %d of the %d keys", moving, len(keys))
}

// TestTopicsCommandsOnFiles: with no relay running, relay topics create,
// alter, describe and delete act on the data directory itself; a
// partition increase is refused without --allow-repartition with a
// report that matches a count made with franz-go's partitioner, and a
// decrease always.
func TestTopicsCommandsOnFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin, dir := testbin.Relay(t), t.TempDir()
	run := func(wantCode int, args ...string) string {
		t.Helper()
		r, err := testbin.Run(ctx, bin, nil, append(args, "--data-dir", dir)...)
		if err != nil || r.Code != wantCode {
			t.Fatalf("relay %s: %v, exit %d (want %d)\n%s\n%s", strings.Join(args, " "), err, r.Code, wantCode, r.Stdout, r.Stderr)
		}
		return r.Stdout + r.Stderr
	}
	run(1, "topics", "describe", "orders")
	run(2, "topics", "create", "orders", "--config", "retention.hours=3")
	if _, err := os.Stat(filepath.Join(dir, "meta.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused create made the data directory: %v", err)
	}
	run(2, "topics", "create", "orders")
	run(0, "topics", "create", "orders", "--partitions", "3", "--config", "cleanup.policy=delete,compact", "--config", "retention.ms=60000")

	b, err := broker.Open(ctx, broker.Options{Dir: dir, JanitorInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	for i := range 200 {
		k := fmt.Sprintf("customer-%d", i%61)
		keys[k] = true
		batch := broker.EncodeBatch(-1, -1, -1, []broker.Record{{Key: []byte(k), Value: []byte("v"), Timestamp: time.Now()}})
		if _, err := b.Append(ctx, "orders", broker.PartitionForKey([]byte(k), 3), batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	want := keyMovement("orders", keys, 3, 7)
	if out := run(1, "topics", "alter", "orders", "--partitions", "7"); !strings.Contains(out, want) || !strings.Contains(out, "--allow-repartition") {
		t.Fatalf("refused increase: %s; want %q", out, want)
	}
	if out := run(1, "topics", "alter", "orders", "--partitions", "2", "--allow-repartition"); !strings.Contains(out, "never lowered") {
		t.Fatalf("decrease: %s", out)
	}
	run(0, "topics", "alter", "orders", "--partitions", "7", "--allow-repartition", "--config", "segment.bytes=4096", "--delete-config", "retention.ms")

	var d struct {
		Partitions []struct {
			EndOffset int64 `json:"end_offset"`
		} `json:"partitions"`
		Configs map[string]string `json:"configs"`
	}
	if err := json.Unmarshal([]byte(run(0, "topics", "describe", "orders", "--json")), &d); err != nil {
		t.Fatal(err)
	}
	var records int64
	for _, p := range d.Partitions {
		records += p.EndOffset
	}
	if len(d.Partitions) != 7 || records != 200 || d.Configs["cleanup.policy"] != "delete,compact" ||
		d.Configs["segment.bytes"] != "4096" || d.Configs["retention.ms"] != "604800000" {
		t.Fatalf("describe after alter: %+v", d)
	}
	run(0, "topics", "delete", "orders")
	if out := run(0, "topics"); !strings.Contains(out, "no topics") {
		t.Fatalf("relay topics after delete: %s", out)
	}
}
