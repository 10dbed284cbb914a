package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openTest(t testing.TB, dir string, mod func(*Options)) *Broker {
	t.Helper()
	opts := Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()}
	if mod != nil {
		mod(&opts)
	}
	b, err := Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// openWithTopic opens a broker in dir (openTest) with one topic created.
func openWithTopic(t testing.TB, dir string, mod func(*Options), topic string, cfg TopicConfig) *Broker {
	t.Helper()
	b := openTest(t, dir, mod)
	mustCreate(t, b, topic, cfg)
	return b
}

func mustCreate(t testing.TB, b *Broker, name string, cfg TopicConfig) {
	t.Helper()
	if _, err := b.CreateTopic(name, cfg); err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

func recs(prefix string, n int) []Record {
	out := make([]Record, n)
	for i := range out {
		out[i] = Record{
			Key:       []byte(fmt.Sprintf("%s-k%d", prefix, i)),
			Value:     []byte(fmt.Sprintf("%s-v%d", prefix, i)),
			Headers:   []Header{{Key: "event-id", Value: []byte(fmt.Sprintf("%s-%d", prefix, i))}},
			Timestamp: time.UnixMilli(1_700_000_000_000 + int64(i)),
		}
	}
	return out
}

func mustAppend(t testing.TB, b *Broker, topic string, part int32, batch []byte) AppendResult {
	t.Helper()
	res, err := b.Append(context.Background(), topic, part, batch)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return res
}

// fetchFromStart fetches a partition from its log start until a fetch
// returns nothing, read_committed when committed is set: read takes each
// result with the offset it was fetched at and returns the offset of the
// next fetch.
func fetchFromStart(t testing.TB, b *Broker, topic string, part int32, committed bool, read func(off int64, res FetchResult) int64) {
	t.Helper()
	off, _, err := b.Offsets(topic, part)
	if err != nil {
		t.Fatal(err)
	}
	for {
		res, err := b.fetchInto(context.Background(), topic, part, off, 1<<20, nil, committed)
		if err != nil {
			t.Fatalf("fetch at %d: %v", off, err)
		}
		if len(res.Batches) == 0 {
			return
		}
		off = read(off, res)
	}
}

// readAll fetches every record of a partition from its log start.
func readAll(t testing.TB, b *Broker, topic string, part int32) []Record {
	t.Helper()
	var out []Record
	fetchFromStart(t, b, topic, part, false, func(off int64, res FetchResult) int64 {
		for r, err := range ReadRecords(res.Batches) {
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if r.Offset >= off {
				out = append(out, r)
			}
		}
		last, _ := lastBatchEnd(res.Batches)
		return last
	})
	return out
}

func lastBatchEnd(data []byte) (int64, error) {
	var end int64
	for b, err := range Batches(data) {
		if err != nil {
			return 0, err
		}
		h, _ := ParseBatchHeader(b)
		end = h.LastOffset() + 1
	}
	return end, nil
}

func TestAppendFetchRoundTrip(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "orders", TopicConfig{Partitions: 3})
	var want []Record
	for i := 0; i < 10; i++ {
		rs := recs(fmt.Sprintf("b%d", i), 5)
		res := mustAppend(t, b, "orders", 1, EncodeBatch(-1, -1, -1, rs))
		if res.BaseOffset != int64(i*5) {
			t.Fatalf("batch %d base offset %d", i, res.BaseOffset)
		}
		want = append(want, rs...)
	}
	got := readAll(t, b, "orders", 1)
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Offset != int64(i) || string(got[i].Key) != string(want[i].Key) || string(got[i].Value) != string(want[i].Value) ||
			!got[i].Timestamp.Equal(want[i].Timestamp) || string(got[i].Headers[0].Value) != string(want[i].Headers[0].Value) {
			t.Fatalf("record %d: got %+v want %+v", i, got[i], want[i])
		}
	}
	// maxBytes smaller than one batch still returns that batch.
	res, err := b.Fetch(context.Background(), "orders", 1, 7, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseBatchHeader(res.Batches)
	if err != nil || h.BaseOffset != 5 || len(res.Batches) != h.Size() || res.HighWatermark != 50 {
		t.Fatalf("small fetch: %+v %v hw=%d", h, err, res.HighWatermark)
	}
	if _, err := b.Fetch(context.Background(), "orders", 1, 51, 100); !errors.Is(err, ErrOffsetOutOfRange) {
		t.Fatalf("fetch past end: %v", err)
	}
	if _, err := b.Fetch(context.Background(), "orders", 7, 0, 100); !errors.Is(err, ErrUnknownTopicOrPartition) {
		t.Fatalf("fetch bad partition: %v", err)
	}
	// Data survives a reopen.
	dir := b.opts.Dir
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := openTest(t, dir, nil)
	if got := readAll(t, b2, "orders", 1); len(got) != 50 {
		t.Fatalf("after reopen: %d records", len(got))
	}
	ti, err := b2.Topic("orders")
	if err != nil || len(ti.Partitions) != 3 || ti.Partitions[1].HighWatermark != 50 {
		t.Fatalf("topic info %+v %v", ti, err)
	}
}

func TestCompressedRoundTrip(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "c", TopicConfig{CleanupPolicy: CleanupCompact})
	for _, c := range []Compression{CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		batch, err := AppendBatch(nil, BatchOptions{ProducerID: -1, ProducerEpoch: -1, BaseSequence: -1, Compression: c}, recs(c.String(), 20))
		if err != nil {
			t.Fatal(err)
		}
		mustAppend(t, b, "c", 0, batch)
	}
	got := readAll(t, b, "c", 0)
	if len(got) != 80 || string(got[79].Value) != "zstd-v19" {
		t.Fatalf("got %d records, last %q", len(got), got[len(got)-1].Value)
	}
	keyless := EncodeBatch(-1, -1, -1, []Record{{Value: []byte("x")}})
	if _, err := b.Append(context.Background(), "c", 0, keyless); !errors.Is(err, ErrKeylessCompacted) {
		t.Fatalf("keyless on compacted: %v", err)
	}
	gz, _ := AppendBatch(nil, BatchOptions{ProducerID: -1, Compression: CompressionGzip}, []Record{{Value: []byte("x")}})
	if _, err := b.Append(context.Background(), "c", 0, gz); !errors.Is(err, ErrKeylessCompacted) {
		t.Fatalf("keyless compressed on compacted: %v", err)
	}
}

func TestBadInputRejected(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "t", TopicConfig{MaxMessageBytes: 4096})
	good := EncodeBatch(-1, -1, -1, recs("a", 3))
	flip := append([]byte(nil), good...)
	flip[len(flip)-1] ^= 0xff
	magic := append([]byte(nil), good...)
	magic[batchMagicPos] = 1
	short := good[:len(good)-3]
	big := EncodeBatch(-1, -1, -1, []Record{{Key: []byte("k"), Value: make([]byte, 5000)}})
	cases := []struct {
		name  string
		topic string
		batch []byte
		want  error
	}{
		{"crc", "t", flip, ErrInvalidCRC},
		{"crc is corrupt", "t", flip, ErrCorruptBatch},
		{"magic", "t", magic, ErrUnsupportedMagic},
		{"truncated", "t", short, ErrCorruptBatch},
		{"too large", "t", big, ErrMessageTooLarge},
		{"invalid topic", "bad/name", good, ErrInvalidTopic},
		{"unknown topic", "nope", good, ErrUnknownTopicOrPartition},
		{"empty", "t", nil, ErrCorruptBatch},
	}
	for _, c := range cases {
		if _, err := b.Append(context.Background(), c.topic, 0, c.batch); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if _, hw, _ := b.Offsets("t", 0); hw != 0 {
		t.Fatalf("bad input wrote data: hw %d", hw)
	}
	for _, name := range []string{"", ".", "..", string(make([]byte, 250)), "a b", "ü"} {
		if _, err := b.CreateTopic(name, TopicConfig{}); !errors.Is(err, ErrInvalidTopic) {
			t.Errorf("topic %q: %v", name, err)
		}
	}
	for _, name := range []string{"a", "A.b_c-1", string(make([]byte, 0)) + "x"} {
		if err := ValidateTopicName(name); err != nil {
			t.Errorf("valid %q: %v", name, err)
		}
	}
	if _, err := b.CreateTopic("t", TopicConfig{}); !errors.Is(err, ErrTopicExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	if KafkaErrorCode(fmt.Errorf("wrapped: %w", ErrOutOfOrderSequence)) != 45 || KafkaErrorCode(ErrInvalidProducerEpoch) != 47 ||
		KafkaErrorCode(ErrInvalidCRC) != 2 || KafkaErrorCode(nil) != 0 || KafkaErrorCode(ErrOffsetOutOfRange) != 1 {
		t.Fatal("kafka error codes")
	}
}

func TestAutoCreate(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), func(o *Options) { o.AutoCreateTopics = true; o.DefaultPartitions = 4 })
	mustAppend(t, b, "auto", 3, EncodeBatch(-1, -1, -1, recs("a", 1)))
	ti, err := b.Topic("auto")
	if err != nil || len(ti.Partitions) != 4 {
		t.Fatalf("%+v %v", ti, err)
	}
	if _, err := b.Append(context.Background(), "bad name", 0, EncodeBatch(-1, -1, -1, recs("a", 1))); !errors.Is(err, ErrInvalidTopic) {
		t.Fatal(err)
	}
}

func TestIdempotentProducer(t *testing.T) {
	t.Parallel()
	type step struct {
		epoch int16
		seq   int32
		n     int
		want  error
		dupOf int64 // expected original base offset for duplicates, -1 otherwise
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"in order", []step{{0, 0, 2, nil, -1}, {0, 2, 3, nil, -1}, {0, 5, 1, nil, -1}}},
		{"duplicate of last", []step{{0, 0, 2, nil, -1}, {0, 0, 2, nil, 0}}},
		{"duplicate of older within five", []step{{0, 0, 1, nil, -1}, {0, 1, 1, nil, -1}, {0, 2, 1, nil, -1}, {0, 0, 1, nil, 0}, {0, 1, 1, nil, 1}}},
		{"older than five is out of order", []step{{0, 0, 1, nil, -1}, {0, 1, 1, nil, -1}, {0, 2, 1, nil, -1}, {0, 3, 1, nil, -1}, {0, 4, 1, nil, -1}, {0, 5, 1, nil, -1}, {0, 0, 1, ErrOutOfOrderSequence, -1}}},
		{"gap", []step{{0, 0, 2, nil, -1}, {0, 3, 1, ErrOutOfOrderSequence, -1}}},
		{"overlap not equal", []step{{0, 0, 2, nil, -1}, {0, 1, 2, ErrOutOfOrderSequence, -1}}},
		{"stale epoch", []step{{1, 0, 1, nil, -1}, {0, 1, 1, ErrInvalidProducerEpoch, -1}}},
		{"new epoch at zero", []step{{0, 0, 3, nil, -1}, {1, 0, 1, nil, -1}, {1, 1, 1, nil, -1}}},
		{"new epoch not at zero", []step{{0, 0, 3, nil, -1}, {1, 3, 1, ErrOutOfOrderSequence, -1}}},
		{"first batch any sequence", []step{{0, 17, 1, nil, -1}, {0, 18, 1, nil, -1}}},
		{"sequence wraps", []step{{0, 1<<31 - 2, 2, nil, -1}, {0, 0, 1, nil, -1}}},
		{"duplicate after new epoch is not a duplicate", []step{{0, 0, 1, nil, -1}, {1, 0, 1, nil, -1}, {0, 0, 1, ErrInvalidProducerEpoch, -1}}},
	}
	b := openTest(t, t.TempDir(), nil)
	for i, c := range cases {
		topic := fmt.Sprintf("idem%d", i)
		mustCreate(t, b, topic, TopicConfig{})
		t.Run(c.name, func(t *testing.T) {
			var next int64
			for j, s := range c.steps {
				res, err := b.Append(context.Background(), topic, 0, EncodeBatch(42, s.epoch, s.seq, recs("x", s.n)))
				if !errors.Is(err, s.want) {
					t.Fatalf("step %d: err %v, want %v", j, err, s.want)
				}
				if err != nil {
					continue
				}
				if s.dupOf >= 0 {
					if !res.Duplicate || res.BaseOffset != s.dupOf {
						t.Fatalf("step %d: want duplicate of %d, got %+v", j, s.dupOf, res)
					}
					continue
				}
				if res.Duplicate || res.BaseOffset != next {
					t.Fatalf("step %d: got %+v, want base %d", j, res, next)
				}
				next += int64(s.n)
			}
			if _, hw, _ := b.Offsets(topic, 0); hw != next {
				t.Fatalf("hw %d, want %d", hw, next)
			}
		})
	}
}

func TestProducerStateSurvivesReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "p", TopicConfig{SegmentBytes: 2048})
	pid, err := b.InitProducerID(context.Background(), "relay-1")
	if err != nil {
		t.Fatal(err)
	}
	var batches [][]byte
	seq := int32(0)
	for i := 0; i < 30; i++ {
		batch := EncodeBatch(pid.ID, pid.Epoch, seq, recs(fmt.Sprint(i), 3))
		batches = append(batches, append([]byte(nil), batch...))
		mustAppend(t, b, "p", 0, batch)
		seq += 3
	}
	if ti, _ := b.Topic("p"); ti.Partitions[0].Segments < 3 {
		t.Fatalf("expected several segments, got %d", ti.Partitions[0].Segments)
	}
	st, ok, err := b.ProducerState("p", 0, pid.ID)
	if err != nil || !ok || st.LastSequence() != 89 || st.LastOffset() != 89 || st.Epoch != pid.Epoch {
		t.Fatalf("state %+v %v %v", st, ok, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, clean := range []bool{true, false} {
		if !clean {
			// Without snapshots, state is rebuilt from the log alone.
			removeSnapshots(t, partitionDir(dir, "p", 0))
		}
		b2 := openTest(t, dir, nil)
		st2, ok, _ := b2.ProducerState("p", 0, pid.ID)
		if !ok || st2.LastSequence() != 89 || len(st2.Batches) != 5 {
			t.Fatalf("clean=%v: state after reopen %+v", clean, st2)
		}
		res, err := b2.Append(context.Background(), "p", 0, batches[27])
		if err != nil || !res.Duplicate || res.BaseOffset != 81 {
			t.Fatalf("clean=%v: retried batch: %+v %v", clean, res, err)
		}
		if _, err := b2.Append(context.Background(), "p", 0, EncodeBatch(pid.ID, pid.Epoch, 95, recs("z", 1))); !errors.Is(err, ErrOutOfOrderSequence) {
			t.Fatalf("gap after reopen: %v", err)
		}
		_ = b2.Close()
	}
	b3 := openTest(t, dir, nil)
	pid2, err := b3.InitProducerID(context.Background(), "relay-1")
	if err != nil || pid2.ID != pid.ID || pid2.Epoch != pid.Epoch+1 {
		t.Fatalf("stable id: %+v %v", pid2, err)
	}
	other, _ := b3.InitProducerID(context.Background(), "")
	if other.ID == pid.ID {
		t.Fatal("fresh id reused")
	}
	if _, err := b3.Append(context.Background(), "p", 0, EncodeBatch(pid2.ID, pid2.Epoch, 0, recs("e", 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := b3.Append(context.Background(), "p", 0, EncodeBatch(pid.ID, pid.Epoch, 90, recs("e", 1))); !errors.Is(err, ErrInvalidProducerEpoch) {
		t.Fatalf("fenced producer: %v", err)
	}
}

// TestAppendAsync checks that appends land in call order, that the high
// watermark (what consumers see) stays behind until a wait made them
// durable, and that waiting on the later append covers the earlier one.
func TestAppendAsync(t *testing.T) {
	t.Parallel()
	b := openTest(t, t.TempDir(), nil)
	mustCreate(t, b, "async", TopicConfig{})
	ctx := context.Background()
	first, waitFirst, err := b.AppendAsync(ctx, "async", 0, EncodeBatch(3, 0, 0, recs("a", 2)))
	if err != nil {
		t.Fatal(err)
	}
	second, waitSecond, err := b.AppendAsync(ctx, "async", 0, EncodeBatch(3, 0, 2, recs("b", 3)))
	if err != nil {
		t.Fatal(err)
	}
	if first.BaseOffset != 0 || second.BaseOffset != 2 {
		t.Fatalf("offsets %d and %d, want 0 and 2", first.BaseOffset, second.BaseOffset)
	}
	if _, hw, _ := b.Offsets("async", 0); hw != 0 {
		t.Fatalf("high watermark %d before any wait, want 0", hw)
	}
	if err := waitSecond(); err != nil {
		t.Fatal(err)
	}
	if _, hw, _ := b.Offsets("async", 0); hw != 5 {
		t.Fatalf("high watermark %d after the wait, want 5", hw)
	}
	if err := waitFirst(); err != nil {
		t.Fatal(err)
	}
	if got := len(readAll(t, b, "async", 0)); got != 5 {
		t.Fatalf("read %d records, want 5", got)
	}
	// A retried batch is a duplicate with its original offset, and its wait
	// succeeds at once.
	dup, waitDup, err := b.AppendAsync(ctx, "async", 0, EncodeBatch(3, 0, 0, recs("a", 2)))
	if err != nil || !dup.Duplicate || dup.BaseOffset != 0 || waitDup() != nil {
		t.Fatalf("retry: %+v %v", dup, err)
	}
}
