package broker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/internal/testwait"
)

// powerLoss copies a live broker's data directory into a new one as a
// machine crash would leave it: each partition's active segment loses what
// was written since it was created, as none was fsynced since (no
// checkpoint ran), while the journal keeps what its fsyncs covered. Older
// segments were fsynced when they rolled.
func powerLoss(t *testing.T, dir string) string {
	t.Helper()
	crashed := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", crashed).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	_ = os.Remove(filepath.Join(crashed, "LOCK"))
	parts, err := filepath.Glob(filepath.Join(crashed, "topics", "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pdir := range parts {
		bases, _, err := listSegmentBases(OSFS{}, pdir, false)
		if err != nil || len(bases) == 0 {
			t.Fatalf("segments of %s: %v %v", pdir, bases, err)
		}
		if err := os.Truncate(segmentName(pdir, bases[len(bases)-1], logSuffix), 0); err != nil {
			t.Fatal(err)
		}
	}
	return crashed
}

func values(t *testing.T, b *Broker, topic string, part int32) []string {
	t.Helper()
	var vals []string
	for _, r := range readAll(t, b, topic, part) {
		vals = append(vals, string(r.Value))
	}
	return vals
}

func TestJournalRestoresWhatSegmentsLost(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "j", TopicConfig{Partitions: 4})
	var wg sync.WaitGroup
	for p := int32(0); p < 4; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				batch := EncodeBatch(int64(10+p), 0, int32(i*3), recs(fmt.Sprintf("p%d-b%d", p, i), 3))
				if _, err := b.Append(context.Background(), "j", p, batch); err != nil {
					t.Errorf("append: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	want := map[int32][]string{}
	for p := int32(0); p < 4; p++ {
		want[p] = values(t, b, "j", p)
		if len(want[p]) != 75 {
			t.Fatalf("partition %d holds %d records before the crash, want 75", p, len(want[p]))
		}
	}

	crashed := powerLoss(t, dir)
	// A torn record at the journal's end: written, never acknowledged.
	nums, err := listJournals(OSFS{}, filepath.Join(crashed, journalDir))
	if err != nil || len(nums) != 1 {
		t.Fatalf("journal files %v, %v", nums, err)
	}
	f, err := os.OpenFile(journalName(filepath.Join(crashed, journalDir), nums[0]), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte{0, 0, 1, 0, 9, 9, 9, 9, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	f.Close()

	r := openTest(t, crashed, nil)
	for p := int32(0); p < 4; p++ {
		if got := values(t, r, "j", p); strings.Join(got, ",") != strings.Join(want[p], ",") {
			t.Fatalf("partition %d after the crash holds %v, want %v", p, got, want[p])
		}
		// Producer state came back too: the last batch is a duplicate.
		res := mustAppend(t, r, "j", p, EncodeBatch(int64(10+p), 0, 24*3, recs(fmt.Sprintf("p%d-b24", p), 3)))
		if !res.Duplicate || res.BaseOffset != 72 {
			t.Fatalf("partition %d: retried last batch answered %+v, want a duplicate at 72", p, res)
		}
	}
	// The replayed journal is gone; the segments hold everything now.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if nums, _ := listJournals(OSFS{}, filepath.Join(crashed, journalDir)); len(nums) != 0 {
		t.Fatalf("journal files left after a clean close: %v", nums)
	}
	again := openTest(t, crashed, nil)
	if got := values(t, again, "j", 3); len(got) != 75 {
		t.Fatalf("partition 3 holds %d records after reopening, want 75", len(got))
	}
}

// After a failed journal fsync nothing is acknowledged until the broker
// was reopened; the reopen replays the journal, and a crash after it keeps
// every acknowledged batch once, with the unacknowledged one at most once.
func TestJournalBoundsFileAfterFailedFsync(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS = ffs; o.ReopenInterval = -1 }, "f", TopicConfig{})
	mustAppend(t, b, "f", 0, EncodeBatch(9, 0, 0, recs("a", 2)))
	ffs.inject(faultRule{op: opSync, suffix: journalSuffix, times: -1})
	if _, err := b.Append(context.Background(), "f", 0, EncodeBatch(100, 0, 0, recs("x", 2))); err == nil {
		t.Fatal("append acknowledged despite a failed fsync")
	}
	ffs.clear()
	if _, err := b.Append(context.Background(), "f", 0, EncodeBatch(9, 0, 2, recs("b", 2))); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("append before reopening: %v", err)
	}
	if err := b.Reopen(context.Background()); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, b, "f", 0, EncodeBatch(9, 0, 2, recs("b", 2)))
	check := func(b *Broker) {
		t.Helper()
		got := strings.Join(values(t, b, "f", 0), ",")
		if got != "a-v0,a-v1,b-v0,b-v1" && got != "a-v0,a-v1,x-v0,x-v1,b-v0,b-v1" {
			t.Fatalf("log holds %s", got)
		}
	}
	check(b)
	check(openTest(t, ffs.crashCopy(t, dir), nil))
}

// A journal file past journalFileBytes is rotated and, once the segments
// are fsynced, deleted.
func TestJournalCheckpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "c", TopicConfig{Partitions: 2})
	big := make([]Record, 1)
	big[0] = Record{Key: []byte("k"), Value: make([]byte, 512<<10)}
	for i := 0; i < (journalFileBytes/(512<<10))+8; i++ {
		mustAppend(t, b, "c", int32(i%2), EncodeBatch(-1, -1, -1, big))
	}
	waitCheckpointed(t, filepath.Join(dir, journalDir))
}

// waitCheckpointed waits up to 2 s for the first journal file in jdir to
// be rotated out and deleted by the checkpoint.
func waitCheckpointed(t *testing.T, jdir string) {
	t.Helper()
	// The background checkpoint writes out and fsyncs every partition
	// the file holds (2,500 in TestJournalRotatesLaterWithManyPartitions):
	// on a loaded 2-core CI machine that took longer than 2 s.
	testwait.Until(t, 30*time.Second, "the full journal file to be checkpointed", func() error {
		nums, err := listJournals(OSFS{}, jdir)
		if err != nil {
			t.Fatal(err)
		}
		if len(nums) == 1 && nums[0] > 1 {
			return nil
		}
		return fmt.Errorf("journal files %v", nums)
	})
}

// A segment write that fails and cannot be cut back leaves a torn batch at
// the segment's end. The batches written before it and not yet fsynced
// must survive, the failed one must not, and appends go on after them.
// Cutting back to the last fsync instead dropped the batches since while
// their journal records stayed: the next batch took their offsets and was
// acknowledged, and after a power loss the replay put a dropped batch back
// in its place. (Without write-back, writeback.go, an append writes its
// segment at once, so the fault hits the append; with it a failed write
// keeps the bytes, TestWriteBackWriteFaults. The journal's write comes
// later, in the sync: TestJournalWriteFaultGivesUpUnsyncedBatches.)
func TestTornWriteKeepsEarlierBatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := &faultFS{suffixes: []string{logSuffix}}
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.WriteBackBytes = ffs, -1 }, "t", TopicConfig{Partitions: 2})
	ctx := context.Background()
	p := &twoProducers{t: t, b: b}
	p.mustAppend(0, "a")
	waitC := p.appendAsync(0, "c")
	ffs.failWrite.Store(true)
	ffs.failTruncate.Store(true)
	if _, _, err := b.AppendAsync(ctx, "t", 0, p.batch(0, "d")); err == nil {
		t.Fatal("append accepted despite a failed write")
	}
	ffs.failWrite.Store(false)
	ffs.failTruncate.Store(false)
	res, waitE, err := b.AppendAsync(ctx, "t", 0, p.batch(0, "e"))
	if err != nil {
		t.Fatalf("append after the fault: %v", err)
	}
	if err := waitE(); err != nil {
		t.Fatalf("batch written after the fault: %v", err)
	}
	if err := waitC(); err != nil {
		t.Fatalf("batch written before the fault: %v", err)
	}
	if res.BaseOffset != 4 {
		t.Fatalf("the batch after the fault has offset %d, want 4", res.BaseOffset)
	}
	want := [2]string{"a-v0,a-v1,c-v0,c-v1,e-v0,e-v1", ""}
	p.check(b, want)
	p.check(openTest(t, powerLoss(t, dir), nil), want)
}

// twoProducers appends two-record batches named a, b, ... for producer 1
// on partition 0 and producer 2 on partition 1 of topic t.
type twoProducers struct {
	t   *testing.T
	b   *Broker
	seq [2]int32
}

func (p *twoProducers) batch(part int32, name string) []byte {
	return EncodeBatch(int64(part)+1, 0, p.seq[part], recs(name, 2))
}

func (p *twoProducers) mustAppend(part int32, name string) {
	p.t.Helper()
	mustAppend(p.t, p.b, "t", part, p.batch(part, name))
	p.seq[part] += 2
}

// appendAsync appends without waiting and moves the sequence on.
func (p *twoProducers) appendAsync(part int32, name string) func() error {
	p.t.Helper()
	_, wait, err := p.b.AppendAsync(context.Background(), "t", part, p.batch(part, name))
	if err != nil {
		p.t.Fatal(err)
	}
	p.seq[part] += 2
	return wait
}

func (p *twoProducers) check(b *Broker, want [2]string) {
	p.t.Helper()
	for part := range int32(2) {
		if got := strings.Join(values(p.t, b, "t", part), ","); got != want[part] {
			p.t.Fatalf("partition %d holds %s, want %s", part, got, want[part])
		}
	}
}

// The journal gathers records and writes them in the sync that waits for
// them. A write that fails there, torn and not cut back, gives up every
// record since the last fsync: batches of both partitions, none of them
// acknowledged, fail with the write's error and roll back, and the broker
// stays healthy. Producer 1 retries d, which takes the same offsets;
// producer 2 gives c up, and producer 3's x takes its offsets. After a
// power loss neither the torn record nor the given-up c comes back in x's
// place (the next journal file bounds the old one at its last fsync).
func TestJournalWriteFaultGivesUpUnsyncedBatches(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := &faultFS{suffixes: []string{journalSuffix}}
	b := openWithTopic(t, dir, func(o *Options) { o.FS = ffs }, "t", TopicConfig{Partitions: 2})
	p := &twoProducers{t: t, b: b}
	p.mustAppend(0, "a")
	ffs.failWrite.Store(true)
	ffs.failTruncate.Store(true)
	waitC := p.appendAsync(1, "c")
	waitD := p.appendAsync(0, "d")
	for name, wait := range map[string]func() error{"c": waitC, "d": waitD} {
		if err := wait(); !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) || KafkaErrorCode(err) != kerr.KafkaStorageError.Code {
			t.Fatalf("batch %s over a failed journal write: %v", name, err)
		}
	}
	if err := b.Health(); err != nil {
		t.Fatalf("a failed journal write made the broker fail: %v", err)
	}
	ffs.failWrite.Store(false)
	ffs.failTruncate.Store(false)
	p.seq[0] = 2 // d again, with its sequence
	appendAt := func(part int32, name string, batch []byte, off int64) {
		t.Helper()
		res, err := b.Append(context.Background(), "t", part, batch)
		if err != nil {
			t.Fatalf("batch %s after the fault: %v", name, err)
		}
		if res.BaseOffset != off {
			t.Fatalf("batch %s after the fault has offset %d, want %d", name, res.BaseOffset, off)
		}
	}
	appendAt(0, "d", p.batch(0, "d"), 2)
	p.seq[0] += 2
	appendAt(1, "x", EncodeBatch(3, 0, 0, recs("x", 2)), 0)
	appendAt(0, "e", p.batch(0, "e"), 4)
	want := [2]string{"a-v0,a-v1,d-v0,d-v1,e-v0,e-v1", "x-v0,x-v1"}
	p.check(b, want)
	p.check(openTest(t, powerLoss(t, dir), nil), want)
}

// Four producers append while the journal's writes fail now and then
// (ENOSPC, whole or torn): every failed append is retried with the same
// sequence until taken, as a Kafka producer does. The broker stays
// healthy, and it and a crash copy taken at the end hold every
// acknowledged record once.
func TestJournalWriteFaultUnderLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval = ffs, -1 }, "load", TopicConfig{Partitions: 4})
	var producers []*loadProducer
	for part := range int32(4) {
		producers = append(producers, &loadProducer{part: part, pid: ProducerID{ID: int64(part) + 10}})
	}
	rules := []*faultRule{
		ffs.inject(faultRule{op: opWrite, suffix: journalSuffix, after: 20, times: 5, err: syscall.ENOSPC}),
		ffs.inject(faultRule{op: opShort, suffix: journalSuffix, after: 40, times: 5, err: syscall.ENOSPC}),
	}
	var failed atomic.Int64
	var wg sync.WaitGroup
	for _, lp := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(lp.acked) < 150 {
				if err := lp.append(b, "load"); err != nil {
					if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) {
						lp.err = err
						return
					}
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for _, lp := range producers {
		if lp.err != nil {
			t.Fatalf("partition %d: %v", lp.part, lp.err)
		}
	}
	for i, r := range rules {
		if r.firedCount(ffs) == 0 {
			t.Fatalf("fault %d never fired", i)
		}
	}
	if failed.Load() == 0 {
		t.Fatal("no append failed")
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health: %v", err)
	}
	checkAcked(t, b, "load", producers)
	checkAcked(t, openTest(t, ffs.crashCopy(t, dir), nil), "load", producers)
	t.Logf("%d appends failed and were retried", failed.Load())
}

// With many partitions in a journal file, the checkpoint waits for 32 KiB
// of each (rotateAt): 70 MiB spread over 2,500 partitions stay in one
// file (64 MiB would have rotated it), 10 MiB more pass 2,500 x 32 KiB and
// rotate it, and the checkpoint deletes it.
func TestJournalRotatesLaterWithManyPartitions(t *testing.T) {
	t.Parallel()
	const parts = 2500
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.ScrubBytesPerSecond = -1 }, "m", TopicConfig{Partitions: parts})
	jdir := filepath.Join(dir, journalDir)
	fill := func(bytes int) {
		t.Helper()
		rec := []Record{{Key: []byte("k"), Value: make([]byte, bytes)}}
		for p := range int32(parts) {
			mustAppend(t, b, "m", p, EncodeBatch(-1, -1, -1, rec))
		}
	}
	fill(28 << 10)
	if nums, err := listJournals(OSFS{}, jdir); err != nil || len(nums) != 1 || nums[0] != 1 {
		t.Fatalf("journal files after 70 MiB over %d partitions: %v %v", parts, nums, err)
	}
	fill(4 << 10)
	waitCheckpointed(t, jdir)
}
