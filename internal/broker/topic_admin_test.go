package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestTopicChangesSurviveACrash: a deleted topic stays deleted in the
// crash model, and its batches, still in the journal, do not come back
// into a new topic of the same name (which the running broker refuses to
// create until it reopens); a partition increase is durable, and a
// record acknowledged on a new partition survives.
func TestTopicChangesSurviveACrash(t *testing.T) {
	t.Parallel()
	ffs := newInjectFS()
	dir := t.TempDir()
	b := openTest(t, dir, func(o *Options) { o.FS = ffs })
	mustCreate(t, b, "gone", TopicConfig{Partitions: 2})
	mustCreate(t, b, "grow", TopicConfig{Partitions: 2})
	rec := func(v string) []byte {
		return EncodeBatch(-1, -1, -1, []Record{{Key: []byte(v), Value: []byte(v), Timestamp: time.Now()}})
	}
	for i := range 10 {
		mustAppend(t, b, "gone", int32(i%2), rec(fmt.Sprint("g", i)))
		mustAppend(t, b, "grow", int32(i%2), rec(fmt.Sprint("w", i)))
	}
	if err := b.DeleteTopic("gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.CreateTopic("gone", TopicConfig{Partitions: 2}); !errors.Is(err, ErrRecentlyDeleted) {
		t.Fatalf("recreating before a reopen: %v, want ErrRecentlyDeleted", err)
	}
	if _, err := b.AddPartitions("grow", 1); !errors.Is(err, ErrInvalidPartitions) {
		t.Fatalf("fewer partitions: %v, want ErrInvalidPartitions", err)
	}
	if _, err := b.AddPartitions("grow", 4); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, b, "grow", 3, rec("on-a-new-partition"))

	c := openTest(t, ffs.crashCopy(t, dir), nil)
	if _, err := c.Topic("gone"); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatalf("the deleted topic after a crash: %v", err)
	}
	mustCreate(t, c, "gone", TopicConfig{Partitions: 2})
	for p := range int32(2) {
		if start, end, _ := c.Offsets("gone", p); start != 0 || end != 0 {
			t.Fatalf("gone/%d recreated after the crash holds offsets %d-%d: the journal brought deleted records back", p, start, end)
		}
	}
	ti, err := c.Topic("grow")
	if err != nil || len(ti.Partitions) != 4 {
		t.Fatalf("grow after a crash: %v, %d partitions", err, len(ti.Partitions))
	}
	if rs := readAll(t, c, "grow", 3); len(rs) != 1 || string(rs[0].Value) != "on-a-new-partition" {
		t.Fatalf("grow/3 after a crash: %v", rs)
	}
	m, err := c.KeyMovement(context.Background(), "grow", 8)
	if err != nil || m.Keys != 11 {
		t.Fatalf("key movement: %+v, %v; want 11 keys", m, err)
	}
}

// TestDeleteRecordsAndOffsetsAreDurable: the log start DeleteRecords set
// and the offsets DeleteOffsets removed stay so after a crash (the crash
// model) and after a clean reopen, and Inspect reads the same start.
func TestDeleteRecordsAndOffsetsAreDurable(t *testing.T) {
	t.Parallel()
	ffs := newInjectFS()
	dir := t.TempDir()
	b := openTest(t, dir, func(o *Options) { o.FS = ffs })
	mustCreate(t, b, "t", TopicConfig{Partitions: 1, SegmentBytes: 1024})
	for i := range 40 {
		mustAppend(t, b, "t", 0, EncodeBatch(-1, -1, -1, []Record{{Value: []byte(fmt.Sprintf("%080d", i)), Timestamp: time.Now()}}))
	}
	before := len(b.Topics()[0].Partitions)
	segs := b.Topics()[0].Partitions[0].Segments
	start, err := b.DeleteRecords("t", 0, 25)
	if err != nil || start != 25 {
		t.Fatalf("DeleteRecords: %d, %v", start, err)
	}
	if s := b.Topics()[0].Partitions[0].Segments; s >= segs {
		t.Fatalf("%d segments before, %d after: the whole ones below 25 stay", segs, s)
	}
	for _, g := range []string{"g", "h"} {
		if err := b.CommitOffsets(context.Background(), g, []OffsetCommit{{Topic: "t", Partition: 0, Offset: 30}}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.DeleteOffsets("g", []TopicPartition{{Topic: "t", Partition: 0}}); err != nil || n != 1 {
		t.Fatalf("DeleteOffsets: %d, %v", n, err)
	}
	check := func(what string, c *Broker) {
		t.Helper()
		if s, _, _ := c.Offsets("t", 0); s != 25 {
			t.Fatalf("%s: log start %d, want 25", what, s)
		}
		if rs := readAll(t, c, "t", 0); rs[0].Offset != 25 || len(rs) != 15 {
			t.Fatalf("%s: read from %d, %d records", what, rs[0].Offset, len(rs))
		}
		if _, ok := c.FetchOffset("g", "t", 0); ok {
			t.Fatalf("%s: the deleted offset is back", what)
		}
		if _, ok := c.FetchOffset("h", "t", 0); !ok {
			t.Fatalf("%s: the other offset is gone", what)
		}
	}
	check("crash", openTest(t, ffs.crashCopy(t, dir), nil))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	check("reopen", openTest(t, dir, nil))
	ins, err := Inspect(context.Background(), dir)
	if err != nil || ins.Topics[0].Partitions[0].LogStartOffset != 25 || before != 1 {
		t.Fatalf("Inspect: %v %+v", err, ins.Topics)
	}
}

// TestDeleteTopicUnderAPinnedReader: a reader (a fetch, the background
// check) reads a pinned segment's handle without the partition lock, so
// deleting the topic under it must leave the handle open until the reader
// lets go. Closing it at once left the reader a nil handle: a panic in the
// background check while a topic was deleted.
func TestDeleteTopicUnderAPinnedReader(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "gone", TopicConfig{Partitions: 1, SegmentBytes: 1024})
	for range 5 {
		mustAppend(t, b, "gone", 0, EncodeBatch(-1, -1, -1, []Record{{Key: []byte("k"), Value: make([]byte, 600), Timestamp: time.Now()}}))
	}
	_, p, err := b.lookup("gone", 0, false)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	if len(p.segs) < 2 {
		p.mu.Unlock()
		t.Fatalf("want a rolled segment, have %d segments", len(p.segs))
	}
	pinned := p.segs[0]
	if err := p.ensureOpenLocked(pinned); err != nil {
		p.mu.Unlock()
		t.Fatal(err)
	}
	p.pinLocked(pinned)
	p.mu.Unlock()

	if err := b.DeleteTopic("gone"); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	f := pinned.log
	p.mu.Unlock()
	if f == nil {
		t.Fatal("deleting the topic closed a segment a reader had pinned")
	}
	var hdr [BatchHeaderSize]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		t.Fatalf("the pinned reader cannot read its segment after the delete: %v", err)
	}
	if _, err := p.fetch(0, 1<<20, nil, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("fetch from a deleted topic: %v, want ErrClosed", err)
	}
	p.unpin(pinned)
	p.mu.Lock()
	defer p.mu.Unlock()
	if pinned.log != nil {
		t.Fatal("the last unpin left the deleted topic's segment open")
	}
}

// TestAddPartitionsMovingNoKey: an increase that moves no key in the log
// (an empty topic, keyless records, keys that all stay on their partition)
// is made; one that would move a key is refused with the report and
// changes nothing.
func TestAddPartitionsMovingNoKey(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	ctx := context.Background()
	// keys finds n keys that do (stay) or do not stay on their partition
	// when 2 partitions become 4.
	keys := func(stay bool, n int) [][]byte {
		var out [][]byte
		for i := 0; len(out) < n; i++ {
			k := []byte(fmt.Sprint("key-", i))
			if (PartitionForKey(k, 2) == PartitionForKey(k, 4)) == stay {
				out = append(out, k)
			}
		}
		return out
	}
	appendKeys := func(topic string, ks [][]byte) {
		for _, k := range ks {
			mustAppend(t, b, topic, PartitionForKey(k, 2), EncodeBatch(-1, -1, -1, []Record{{Key: k, Value: k, Timestamp: time.Now()}}))
		}
	}
	mustCreate(t, b, "empty", TopicConfig{Partitions: 2})
	mustCreate(t, b, "keyless", TopicConfig{Partitions: 2})
	mustCreate(t, b, "staying", TopicConfig{Partitions: 2})
	mustCreate(t, b, "moving", TopicConfig{Partitions: 2})
	for i := range 6 {
		mustAppend(t, b, "keyless", int32(i%2), EncodeBatch(-1, -1, -1, []Record{{Value: []byte("v"), Timestamp: time.Now()}}))
	}
	appendKeys("staying", keys(true, 5))
	appendKeys("moving", append(keys(true, 5), keys(false, 1)...))

	for _, c := range []struct {
		topic        string
		keys, moving int64
		keyless      int64
		refused      bool
	}{
		{"empty", 0, 0, 0, false},
		{"keyless", 0, 0, 6, false},
		{"staying", 5, 0, 0, false},
		{"moving", 6, 1, 0, true},
	} {
		m, err := b.AddPartitionsMovingNoKey(ctx, c.topic, 4)
		if m.Keys != c.keys || m.Moving != c.moving || m.KeylessRecords != c.keyless {
			t.Errorf("%s: report %+v, want %d keys, %d moving, %d keyless", c.topic, m, c.keys, c.moving, c.keyless)
		}
		want := 4
		if c.refused {
			want = 2
			if !errors.Is(err, ErrKeysWouldMove) {
				t.Errorf("%s: %v, want ErrKeysWouldMove", c.topic, err)
			}
		} else if err != nil {
			t.Errorf("%s: %v", c.topic, err)
		}
		if ti, err := b.Topic(c.topic); err != nil || len(ti.Partitions) != want {
			t.Errorf("%s after the increase: %d partitions (%v), want %d", c.topic, len(ti.Partitions), err, want)
		}
	}
	if _, err := b.AddPartitionsMovingNoKey(ctx, "empty", 4); !errors.Is(err, ErrInvalidPartitions) {
		t.Errorf("the same count again: %v, want ErrInvalidPartitions", err)
	}
}
