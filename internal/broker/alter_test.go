package broker

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestAlterTopicConfig: a topic kept forever gets a size retention; the
// janitor's pass deletes its old segments and moves the log start, the
// change survives a reopen, and a partition count change or an invalid
// value is refused with the configuration unchanged.
func TestAlterTopicConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openTest(t, dir, nil)
	mustCreate(t, b, "orders", TopicConfig{Partitions: 2, SegmentBytes: 2048, RetentionMs: -1})
	for i := range 60 {
		rs := []Record{{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, 100), Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i))}}
		mustAppend(t, b, "orders", 0, EncodeBatch(-1, -1, -1, rs))
	}
	if err := b.EnforceRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if start, _, _ := b.Offsets("orders", 0); start != 0 {
		t.Fatalf("log start %d before any retention", start)
	}

	before, _ := b.Topic("orders")
	if _, err := b.AlterTopicConfig("orders", TopicConfig{Partitions: 3}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("3 partitions through AlterTopicConfig: %v, want ErrInvalidConfig", err)
	}
	if _, err := b.AlterTopicConfig("orders", TopicConfig{SegmentBytes: 10}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a 10-byte segment: %v, want ErrInvalidConfig", err)
	}
	if _, err := b.AlterTopicConfig("nope", TopicConfig{}); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatalf("unknown topic: %v", err)
	}
	if got, _ := b.Topic("orders"); got.Config != before.Config {
		t.Fatalf("refused changes altered the config: %+v, was %+v", got.Config, before.Config)
	}

	cfg := before.Config
	cfg.RetentionBytes = 4096
	info, err := b.AlterTopicConfig("orders", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.RetentionBytes != 4096 || info.Config.RetentionMs != -1 || info.Config.Partitions != 2 {
		t.Fatalf("altered config %+v", info.Config)
	}
	if err := b.EnforceRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, hw, _ := b.Offsets("orders", 0)
	if start == 0 || hw != 60 {
		t.Fatalf("after a 4096-byte retention: log start %d, high watermark %d", start, hw)
	}
	if got := readAll(t, b, "orders", 0); int64(len(got)) != hw-start || got[0].Offset != start {
		t.Fatalf("read %d records from %d after retention", len(got), got[0].Offset)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTest(t, dir, nil)
	got, err := b.Topic("orders")
	if err != nil || got.Config != info.Config {
		t.Fatalf("after reopen: %+v, %v; want %+v", got.Config, err, info.Config)
	}
}

// TestDataDirInUse: a second broker on a directory another one holds is
// refused, after the lock's retry, and the first keeps working; once the
// first is closed the directory opens.
func TestDataDirInUse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openTest(t, dir, nil)
	start := time.Now()
	if _, err := Open(context.Background(), Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()}); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("a second broker on a held directory: %v, want in use", err)
	} else if waited := time.Since(start); waited < lockRetry {
		t.Fatalf("refused after %v, before the lock's retry of %v", waited, lockRetry)
	}
	mustCreate(t, b, "still", TopicConfig{})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	openTest(t, dir, nil)
}
