package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }

func TestRetentionByTimeAndSize(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	b := openTest(t, t.TempDir(), func(o *Options) { o.Now = clock.now })
	mustCreate(t, b, "bytime", TopicConfig{SegmentBytes: 2048, RetentionMs: 60_000})
	mustCreate(t, b, "bysize", TopicConfig{SegmentBytes: 2048, RetentionBytes: 4096, RetentionMs: -1})
	for i := 0; i < 60; i++ {
		ts := time.UnixMilli(1_700_000_000_000 + int64(i)*1000)
		rs := []Record{{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, 100), Timestamp: ts}}
		mustAppend(t, b, "bytime", 0, EncodeBatch(-1, -1, -1, rs))
		mustAppend(t, b, "bysize", 0, EncodeBatch(-1, -1, -1, rs))
	}
	clock.ms.Store(1_700_000_000_000 + 100_000) // records older than 40s expire
	if err := b.EnforceRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	start, hw, _ := b.Offsets("bytime", 0)
	if hw != 60 || start == 0 || start > 40 {
		t.Fatalf("time retention: start %d hw %d", start, hw)
	}
	if _, err := b.Fetch(context.Background(), "bytime", 0, 0, 100); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("fetch below log start: %v", err)
	}
	if got := readAll(t, b, "bytime", 0); int64(len(got)) != hw-start || got[0].Offset != start {
		t.Fatalf("after retention read %d records from %d", len(got), got[0].Offset)
	}
	ti, _ := b.Topic("bysize")
	p := ti.Partitions[0]
	if p.Bytes > 4096+2048 || p.Bytes < 4096-2048 || p.LogStartOffset == 0 || p.HighWatermark != 60 {
		t.Fatalf("size retention: %+v", p)
	}
	// Group lag against retention.
	if err := b.CommitOffsets(context.Background(), "g", []OffsetCommit{{Topic: "bytime", Partition: 0, Offset: 5}}); err != nil {
		t.Fatal(err)
	}
	lag, err := b.GroupLag("g")
	if err != nil || len(lag) != 1 || !lag[0].BelowLogStart || lag[0].RetentionMargin >= 0 || lag[0].Lag != hw-start {
		t.Fatalf("lag %+v %v", lag, err)
	}
}

func TestCompaction(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{}
	clock.ms.Store(1_700_000_000_000)
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.Now = clock.now }, "state", TopicConfig{CleanupPolicy: CleanupCompact, SegmentBytes: 1024, DeleteRetentionMs: 60_000})
	pid, _ := b.InitProducerID(context.Background(), "")
	seq := int32(0)
	put := func(key string, value []byte, tsOff int64) {
		rs := []Record{{Key: []byte(key), Value: value, Timestamp: time.UnixMilli(1_700_000_000_000 + tsOff)}}
		mustAppend(t, b, "state", 0, EncodeBatch(pid.ID, pid.Epoch, seq, rs))
		seq++
	}
	for round := 0; round < 5; round++ {
		for k := 0; k < 5; k++ {
			put(fmt.Sprintf("k%d", k), []byte(fmt.Sprintf("r%d", round)), 0)
		}
	}
	put("k0", nil, 0) // tombstone, old
	put("k1", nil, 50_000)
	for i := 0; i < 20; i++ { // push everything above into inactive segments
		put(fmt.Sprintf("filler%d", i), []byte("x"), 100_000)
	}
	_, hwBefore, _ := b.Offsets("state", 0)
	clock.ms.Store(1_700_000_000_000 + 70_000) // k0's tombstone expired, k1's not
	if err := b.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	check := func(b *Broker) {
		t.Helper()
		latest := map[string]string{}
		var prev int64 = -1
		for _, r := range readAll(t, b, "state", 0) {
			if r.Offset <= prev {
				t.Fatalf("offsets not increasing: %d after %d", r.Offset, prev)
			}
			prev = r.Offset
			if _, seen := latest[string(r.Key)]; seen && !strings.HasPrefix(string(r.Key), "filler") {
				t.Fatalf("key %s kept twice", r.Key)
			}
			if r.Value == nil {
				latest[string(r.Key)] = "<tombstone>"
			} else {
				latest[string(r.Key)] = string(r.Value)
			}
		}
		if _, ok := latest["k0"]; ok {
			t.Fatalf("expired tombstone kept: %v", latest)
		}
		if latest["k1"] != "<tombstone>" || latest["k2"] != "r4" || latest["k4"] != "r4" {
			t.Fatalf("after compaction: %v", latest)
		}
		if _, hw, _ := b.Offsets("state", 0); hw != hwBefore {
			t.Fatalf("hw moved: %d -> %d", hwBefore, hw)
		}
	}
	check(b)
	// Offsets are preserved: k2's last value keeps its original offset 22.
	res, err := b.Fetch(context.Background(), "state", 0, 22, 1)
	if err != nil {
		t.Fatal(err)
	}
	for r := range ReadRecords(res.Batches) {
		if r.Offset == 22 && string(r.Key) != "k2" {
			t.Fatalf("offset 22 holds %s", r.Key)
		}
	}
	// Idempotence state survives compaction and a reopen without snapshots.
	_ = b.Close()
	removeSnapshots(t, partitionDir(dir, "state", 0))
	b2 := openTest(t, dir, func(o *Options) { o.Now = clock.now })
	check(b2)
	st, ok, _ := b2.ProducerState("state", 0, pid.ID)
	if !ok || st.LastSequence() != seq-1 {
		t.Fatalf("producer state after compaction: %+v", st)
	}
	if _, err := b2.Append(context.Background(), "state", 0, EncodeBatch(pid.ID, pid.Epoch, seq, []Record{{Key: []byte("k9"), Value: []byte("z")}})); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentAppendersManyPartitions(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	const parts, writers, batches = 8, 16, 30
	mustCreate(t, b, "conc", TopicConfig{Partitions: parts, SegmentBytes: 8192})
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := int32(w % parts)
			for i := 0; i < batches; i++ {
				batch := EncodeBatch(int64(1000+w), 0, int32(i*2), recs(fmt.Sprintf("w%d-%d", w, i), 2))
				if _, err := b.Append(context.Background(), "conc", p, batch); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	// A reader waits for data concurrently.
	wg.Add(1)
	go func() {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Wait(ctx, "conc", 3, 10); err != nil {
			t.Error(err)
		}
	}()
	wg.Wait()
	total := 0
	for p := int32(0); p < parts; p++ {
		got := readAll(t, b, "conc", p)
		for i, r := range got {
			if r.Offset != int64(i) {
				t.Fatalf("partition %d: record %d at offset %d", p, i, r.Offset)
			}
		}
		total += len(got)
	}
	if total != writers*batches*2 {
		t.Fatalf("%d records", total)
	}
}

func TestWaitAndWatch(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "w", TopicConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, "w", 0, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait on empty: %v", err)
	}
	ch, err := b.Watch("w", 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- b.Wait(context.Background(), "w", 0, 0) }()
	mustAppend(t, b, "w", 0, EncodeBatch(-1, -1, -1, recs("a", 1)))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed")
	}
}

func TestOffsetForTime(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.IndexIntervalBytes = 64 }, "ts", TopicConfig{SegmentBytes: 1024})
	for i := 0; i < 50; i++ {
		rs := []Record{
			{Key: []byte("a"), Value: []byte("1"), Timestamp: time.UnixMilli(int64(1000 + i*10))},
			{Key: []byte("b"), Value: []byte("2"), Timestamp: time.UnixMilli(int64(1005 + i*10))},
		}
		mustAppend(t, b, "ts", 0, EncodeBatch(-1, -1, -1, rs))
	}
	for reopen := 0; reopen < 2; reopen++ {
		for _, c := range []struct{ ts, off, found int64 }{
			{0, 0, 1000}, {1000, 0, 1000}, {1003, 1, 1005}, {1006, 2, 1010}, {1255, 51, 1255}, {1491, 99, 1495}, {1496, -1, -1},
		} {
			off, found, err := b.OffsetForTime("ts", 0, time.UnixMilli(c.ts))
			if err != nil || off != c.off || found != c.found {
				t.Fatalf("reopen %d ts %d: %d %d %v, want %d %d", reopen, c.ts, off, found, err, c.off, c.found)
			}
		}
		_ = b.Close()
		b = openTest(t, dir, nil)
	}
}

func TestGroupOffsetsDurable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.OffsetsCompactBytes = 512 }, "t", TopicConfig{Partitions: 2})
	for i := 0; i < 10; i++ {
		mustAppend(t, b, "t", 0, EncodeBatch(-1, -1, -1, recs("a", 1)))
	}
	for i := int64(0); i < 50; i++ {
		if err := b.CommitOffsets(context.Background(), "g1", []OffsetCommit{{Topic: "t", Partition: 0, Offset: i % 8, Metadata: "m"}, {Topic: "t", Partition: 1, Offset: 0}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.CommitOffsets(context.Background(), "g2", []OffsetCommit{{Topic: "t", Partition: 0, Offset: 10}}); err != nil {
		t.Fatal(err)
	}
	if err := b.CommitOffsets(context.Background(), "g2", []OffsetCommit{{Topic: "t", Partition: 5, Offset: 10}}); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatalf("commit to unknown partition: %v", err)
	}
	_ = b.Close()
	b2 := openTest(t, dir, nil)
	c, ok := b2.FetchOffset("g1", "t", 0)
	if !ok || c.Offset != 49%8 || c.Metadata != "m" {
		t.Fatalf("fetch offset %+v %v", c, ok)
	}
	if g := b2.Groups(); len(g) != 2 || g[0] != "g1" {
		t.Fatalf("groups %v", g)
	}
	lag, err := b2.GroupLag("g1")
	if err != nil || len(lag) != 2 || lag[0].Lag != 10-1 || lag[0].RetentionMargin != 1 || lag[0].BelowLogStart {
		t.Fatalf("lag %+v %v", lag, err)
	}
	if _, err := b2.GroupLag("nope"); !errors.Is(err, ErrUnknownGroup) {
		t.Fatal(err)
	}
}

// TestGroupMembershipDurable: a saved membership survives a reopen and the
// offsets file's compaction, is not an offset (no topic "" in the group's
// offsets or lag), is replaced by a later save and deleted with the group.
func TestGroupMembershipDurable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.OffsetsCompactBytes = 512 }, "t", TopicConfig{Partitions: 1})
	for _, st := range []string{"first", "second"} {
		if err := b.SaveGroupMembership("g", []byte(st)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SaveGroupMembership("other", []byte("x")); err != nil {
		t.Fatal(err)
	}
	// Enough commits to compact the file several times.
	for i := int64(0); i < 50; i++ {
		if err := b.CommitOffsets(context.Background(), "g", []OffsetCommit{{Topic: "t", Partition: 0, Offset: i}}); err != nil {
			t.Fatal(err)
		}
	}
	_ = b.Close()
	b = openTest(t, dir, nil)
	if m := b.GroupMemberships(); string(m["g"]) != "second" || string(m["other"]) != "x" || len(m) != 2 {
		t.Fatalf("memberships after reopen: %q", m)
	}
	if offs := b.GroupOffsets("g"); len(offs) != 1 || offs[0].Topic != "t" {
		t.Fatalf("the membership shows among the offsets: %+v", offs)
	}
	if _, err := b.DeleteOffsets("g", nil); err != nil {
		t.Fatal(err)
	}
	if err := b.SaveGroupMembership("other", nil); err != nil {
		t.Fatal(err)
	}
	_ = b.Close()
	b = openTest(t, dir, nil)
	if m := b.GroupMemberships(); len(m) != 0 {
		t.Fatalf("memberships after deleting the group and clearing the other: %q", m)
	}
}

func TestDump(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "d", TopicConfig{Partitions: 2})
	mustAppend(t, b, "d", 1, EncodeBatch(-1, -1, -1, []Record{
		{Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: "h", Value: []byte("x")}}, Timestamp: time.UnixMilli(0)},
		{Key: nil, Value: nil, Timestamp: time.UnixMilli(0)},
	}))
	writeOut(b)
	var text, js bytes.Buffer
	if err := Dump(context.Background(), &text, DumpOptions{DataDir: dir, Partition: -1}); err != nil {
		t.Fatal(err)
	}
	want := "d/1 offset=0 timestamp=1970-01-01T00:00:00Z key=\"k\" value=\"v\" header[\"h\"]=\"x\"\nd/1 offset=1 timestamp=1970-01-01T00:00:00Z key=null value=null\n"
	if text.String() != want {
		t.Fatalf("text dump:\n%s", text.String())
	}
	if err := Dump(context.Background(), &js, DumpOptions{DataDir: dir, Topic: "d", Partition: 1, FromOffset: 1, Format: "json"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(js.String(), `"offset":1`) || strings.Contains(js.String(), `"offset":0`) {
		t.Fatalf("json dump: %s", js.String())
	}
	if err := Dump(context.Background(), &js, DumpOptions{DataDir: dir, Topic: "d", Partition: 9}); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatal(err)
	}
}

// TestMinCompactionLagAndBothPolicies: under min.compaction.lag.ms a
// segment whose newest record is younger stays as written (and so does
// everything after it), and is compacted once old enough; a topic with
// cleanup.policy delete,compact is compacted and has retention too.
func TestMinCompactionLagAndBothPolicies(t *testing.T) {
	t.Parallel()
	const t0 = 1_700_000_000_000
	clock := &fakeClock{}
	clock.ms.Store(t0)
	b := openWithTopic(t, t.TempDir(), func(o *Options) { o.Now = clock.now }, "state",
		TopicConfig{CleanupPolicy: CleanupDeleteCompact, SegmentBytes: 1024, MinCompactionLagMs: 60_000, RetentionMs: 3_600_000})
	put := func(key, value string, tsOff int64) {
		mustAppend(t, b, "state", 0, EncodeBatch(-1, -1, -1, []Record{{Key: []byte(key), Value: []byte(value), Timestamp: time.UnixMilli(t0 + tsOff)}}))
	}
	for round := range 4 {
		for k := range 5 {
			put(fmt.Sprintf("k%d", k), fmt.Sprintf("r%d", round), 0)
		}
	}
	for i := range 20 {
		put(fmt.Sprintf("filler%d", i), "x", 100_000)
	}
	count := func() int {
		n := 0
		for _, r := range readAll(t, b, "state", 0) {
			if strings.HasPrefix(string(r.Key), "k") {
				n++
			}
		}
		return n
	}
	clock.ms.Store(t0 + 30_000) // younger than the lag: nothing compacted
	if err := b.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 20 {
		t.Fatalf("%d records of k* after compacting within min.compaction.lag.ms, want all 20", n)
	}
	clock.ms.Store(t0 + 90_000) // the k* segments are older than the lag, the fillers not
	if err := b.Compact(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 5 {
		t.Fatalf("%d records of k* after the lag, want the newest of each of the 5 keys", n)
	}
	clock.ms.Store(t0 + 100_000 + 3_600_001) // past retention: delete applies too
	if err := b.EnforceRetention(context.Background()); err != nil {
		t.Fatal(err)
	}
	if start, _, _ := b.Offsets("state", 0); start == 0 {
		t.Fatal("retention deleted nothing on a delete,compact topic")
	}
}
