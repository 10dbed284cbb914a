package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outboxrelay/relay/internal/testwait"
)

// logCapture collects a broker's JSON log lines.
type logCapture struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func captureLogs() (*slog.Logger, *logCapture) {
	c := &logCapture{}
	return slog.New(slog.NewJSONHandler(c, &slog.HandlerOptions{Level: slog.LevelInfo})), c
}

// lines returns the logged records whose message is msg.
func (l *logCapture) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// wantLostLogged checks for the ERROR line naming a lost range.
func (l *logCapture) wantLostLogged(t *testing.T, topic string, part int32, first, last int64) {
	t.Helper()
	for _, m := range l.lines(t, "data lost") {
		if m["level"] == "ERROR" && m["topic"] == topic && m["partition"] == float64(part) &&
			m["first_offset"] == float64(first) && m["last_offset"] == float64(last) {
			return
		}
	}
	t.Fatalf("no ERROR log of %s/%d offsets %d to %d lost; logged: %v", topic, part, first, last, l.lines(t, "data lost"))
}

func flipByte(t *testing.T, path string, pos int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var one [1]byte
	if _, err := f.ReadAt(one[:], pos); err != nil {
		t.Fatal(err)
	}
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], pos); err != nil {
		t.Fatal(err)
	}
}

// batchAt is a batch's place in a segment file.
type batchAt struct {
	pos         int64
	size        int
	first, last int64
}

func segmentBatches(t *testing.T, path string) []batchAt {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var out []batchAt
	if _, err := scanBatches(f, 0, st.Size(), true, func(h BatchHeader, pos int64, _ []byte) error {
		out = append(out, batchAt{pos: pos, size: h.Size(), first: h.BaseOffset, last: h.LastOffset()})
		return nil
	}); err != nil {
		t.Fatalf("scan %s: %v", path, err)
	}
	return out
}

// readAround reads a partition as a consumer would, from the log start to
// the high watermark; a fetch failing with ErrDataLost is noted and the
// read goes on after the range b reports. It returns the values read and
// the errors met.
func readAround(t *testing.T, b *Broker, topic string, part int32) ([]string, []error) {
	t.Helper()
	start, hw, err := b.Offsets(topic, part)
	if err != nil {
		t.Fatal(err)
	}
	var vals []string
	var errs []error
	for off := start; off < hw; {
		res, err := b.Fetch(context.Background(), topic, part, off, 1<<20)
		if errors.Is(err, ErrDataLost) {
			errs = append(errs, err)
			lost, lerr := b.Lost(topic, part)
			if lerr != nil {
				t.Fatal(lerr)
			}
			next := off
			for _, r := range lost {
				if r.contains(off) {
					next = r.Last + 1
				}
			}
			if next == off {
				t.Fatalf("fetch at %d failed with %v but no lost range holds it: %+v", off, err, lost)
			}
			off = next
			continue
		}
		if err != nil {
			t.Fatalf("fetch at %d: %v", off, err)
		}
		if len(res.Batches) == 0 {
			t.Fatalf("fetch at %d below the high watermark %d returned nothing", off, hw)
		}
		for r, err := range ReadRecords(res.Batches) {
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if r.Offset >= off {
				vals = append(vals, string(r.Value))
			}
		}
		end, err := lastBatchEnd(res.Batches)
		if err != nil || end <= off {
			t.Fatalf("fetch at %d: batches end at %d: %v", off, end, err)
		}
		off = end
	}
	return vals, errs
}

func wantLost(t *testing.T, b *Broker, topic string, part int32, want ...[2]int64) {
	t.Helper()
	lost, err := b.Lost(topic, part)
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]int64
	for _, r := range lost {
		got = append(got, [2]int64{r.First, r.Last})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s/%d lost %v (%+v), want %v", topic, part, got, lost, want)
	}
	info, err := b.Topic(topic)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(info.Partitions[part].Lost); n != len(want) {
		t.Fatalf("TopicInfo reports %d lost ranges, want %d", n, len(want))
	}
}

// loadProducer appends batches of 3 records to one partition with an
// idempotent producer until it fails, remembering what was acknowledged.
type loadProducer struct {
	part  int32
	pid   ProducerID
	seq   int32
	acked []string
	err   error
	// ackedAfterFailure counts appends acknowledged although the broker
	// had reported a storage failure before they started.
	ackedAfterFailure int
}

func (lp *loadProducer) batch() []byte {
	return EncodeBatch(lp.pid.ID, lp.pid.Epoch, lp.seq, recs(fmt.Sprintf("p%d-s%d", lp.part, lp.seq), 3))
}

// append appends lp's next batch to topic and, once acknowledged,
// remembers its records and moves lp's sequence on.
func (lp *loadProducer) append(b *Broker, topic string) error {
	if _, err := b.Append(context.Background(), topic, lp.part, lp.batch()); err != nil {
		return err
	}
	for j := 0; j < 3; j++ {
		lp.acked = append(lp.acked, fmt.Sprintf("p%d-s%d-v%d", lp.part, lp.seq, j))
	}
	lp.seq += 3
	return nil
}

func (lp *loadProducer) run(b *Broker, topic string, warm *sync.WaitGroup, limit int) {
	warmed := false
	for i := 0; limit < 0 || i < limit; i++ {
		failedBefore := b.Health() != nil
		if err := lp.append(b, topic); err != nil {
			lp.err = err
			break
		}
		if failedBefore {
			lp.ackedAfterFailure++
		}
		if len(lp.acked) >= 60 && !warmed {
			warmed = true
			warm.Done()
		}
	}
	if !warmed {
		warm.Done()
	}
}

// checkAcked verifies that b holds every acknowledged record exactly once.
func checkAcked(t *testing.T, b *Broker, topic string, producers []*loadProducer) {
	t.Helper()
	for _, lp := range producers {
		counts := map[string]int{}
		for _, v := range values(t, b, topic, lp.part) {
			counts[v]++
		}
		for _, v := range lp.acked {
			if counts[v] != 1 {
				t.Fatalf("partition %d holds acknowledged record %s %d times", lp.part, v, counts[v])
			}
		}
		for v, n := range counts {
			if n != 1 {
				t.Fatalf("partition %d holds %s %d times", lp.part, v, n)
			}
		}
	}
}

// An fsync EIO, on a segment or on the journal, under load from four
// producers: no append that starts after the failure is acknowledged, the
// ones waiting for the failed fsync fail, nothing acknowledged is lost even
// if a crash then takes every byte that no good fsync covered (and the
// dirty pages of the failed fsync), and after the fault clears a reopen
// brings the broker back; a crash after that still loses nothing.
func TestFsyncEIOUnderLoad(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		suffix string
		cfg    TopicConfig
	}{
		{"segment", logSuffix, TopicConfig{Partitions: 4, SegmentBytes: 4096}},
		{"journal", journalSuffix, TopicConfig{Partitions: 4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			ffs := newInjectFS()
			logger, logs := captureLogs()
			b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval, o.Logger = ffs, -1, logger }, "load", c.cfg)
			var producers []*loadProducer
			for p := int32(0); p < 4; p++ {
				pid, err := b.InitProducerID(context.Background(), "")
				if err != nil {
					t.Fatal(err)
				}
				producers = append(producers, &loadProducer{part: p, pid: pid})
			}
			var warm, done sync.WaitGroup
			warm.Add(len(producers))
			for _, lp := range producers {
				done.Add(1)
				go func() {
					defer done.Done()
					lp.run(b, "load", &warm, -1)
				}()
			}
			warm.Wait()
			rule := ffs.inject(faultRule{op: opSync, suffix: c.suffix, times: -1})
			done.Wait()
			if rule.firedCount(ffs) == 0 {
				t.Fatal("the fault never fired")
			}
			for _, lp := range producers {
				if !errors.Is(lp.err, ErrStorage) || KafkaErrorCode(lp.err) != kerr.KafkaStorageError.Code {
					t.Fatalf("partition %d stopped with %v, want a storage error", lp.part, lp.err)
				}
				if lp.ackedAfterFailure > 0 {
					t.Fatalf("partition %d: %d appends acknowledged after the failure was reported", lp.part, lp.ackedAfterFailure)
				}
			}
			if err := b.Health(); !errors.Is(err, ErrStorageFailed) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("health: %v", err)
			}
			if len(logs.lines(t, "storage failed: acknowledgements stopped until the broker is reopened from disk")) != 1 {
				t.Fatal("the storage failure was not logged once")
			}
			ffs.clear()
			// The disk works again, but nothing is acknowledged before
			// the broker was reopened.
			if _, err := b.Append(context.Background(), "load", 0, producers[0].batch()); !errors.Is(err, ErrStorageFailed) {
				t.Fatalf("append after the fault cleared, before reopening: %v", err)
			}
			if err := b.Wait(context.Background(), "load", 0, 1<<40); !errors.Is(err, ErrStorageFailed) {
				t.Fatalf("wait after the failure: %v", err)
			}
			checkAcked(t, openTest(t, ffs.crashCopy(t, dir), nil), "load", producers)

			if err := b.Reopen(context.Background()); err != nil {
				t.Fatalf("reopen: %v", err)
			}
			if err := b.Health(); err != nil {
				t.Fatalf("health after reopening: %v", err)
			}
			// Each producer retries its failed batch (a duplicate if the
			// journal brought it back) and drains 20 more.
			warm.Add(len(producers))
			for _, lp := range producers {
				lp.err = nil
				done.Add(1)
				go func() {
					defer done.Done()
					lp.run(b, "load", &warm, 21)
				}()
			}
			done.Wait()
			for _, lp := range producers {
				if lp.err != nil {
					t.Fatalf("partition %d after reopening: %v", lp.part, lp.err)
				}
			}
			checkAcked(t, b, "load", producers)
			checkAcked(t, openTest(t, ffs.crashCopy(t, dir), nil), "load", producers)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			checkAcked(t, openTest(t, dir, nil), "load", producers)
		})
	}
}

// With the automatic reopen on, a broker whose fsync failed once comes
// back by itself once the disk works.
func TestReopensItselfWhenTheDiskWorksAgain(t *testing.T) {
	t.Parallel()
	ffs := newInjectFS()
	b := openTest(t, t.TempDir(), func(o *Options) { o.FS, o.ReopenInterval = ffs, 5*time.Millisecond })
	mustCreate(t, b, "r", TopicConfig{})
	mustAppend(t, b, "r", 0, EncodeBatch(3, 0, 0, recs("a", 1)))
	ffs.inject(faultRule{op: opSync, suffix: journalSuffix, times: 1})
	if _, err := b.Append(context.Background(), "r", 0, EncodeBatch(3, 0, 1, recs("b", 1))); !errors.Is(err, ErrStorageFailed) {
		t.Fatalf("append over a failed fsync: %v", err)
	}
	testwait.Until(t, 10*time.Second, "the broker to be healthy again after the failed fsync", b.Health)
	mustAppend(t, b, "r", 0, EncodeBatch(3, 0, 1, recs("b", 1)))
	if got := strings.Join(values(t, b, "r", 0), ","); got != "a-v0,b-v0" {
		t.Fatalf("log holds %s", got)
	}
}

// A flipped byte in the middle of the active segment after a clean stop:
// the journal is gone, so the batch is reported lost with its exact
// offsets, and the batches after it are kept, not cut.
func TestFlippedByteInActiveSegmentAfterCleanStop(t *testing.T) {
	t.Parallel()
	dir, path := writeBatches(t, 10)
	batches := segmentBatches(t, path)
	flipByte(t, path, batches[7].pos+80)
	logger, logs := captureLogs()
	b := openTest(t, dir, func(o *Options) { o.Logger = logger })
	vals, errs := readAround(t, b, "r", 0)
	if len(vals) != 27 || len(errs) != 1 {
		t.Fatalf("read %d records and %v, want 27 and one error", len(vals), errs)
	}
	if !errors.Is(errs[0], ErrDataLost) || KafkaErrorCode(errs[0]) != kerr.CorruptMessage.Code {
		t.Fatalf("fetch of the lost batch: %v (code %d)", errs[0], KafkaErrorCode(errs[0]))
	}
	for _, v := range vals {
		if strings.HasPrefix(v, "7-") {
			t.Fatalf("served %s from the damaged batch", v)
		}
	}
	wantLost(t, b, "r", 0, [2]int64{21, 23})
	logs.wantLostLogged(t, "r", 0, 21, 23)
	if cuts := cutFiles(t, dir); len(cuts) != 0 {
		t.Fatalf("batches cut: %v", cuts)
	}
	// Producer state continues after the last batch, past the damage.
	if res := mustAppend(t, b, "r", 0, EncodeBatch(7, 0, 30, recs("new", 2))); res.BaseOffset != 30 {
		t.Fatalf("new append at %d", res.BaseOffset)
	}
	if res := mustAppend(t, b, "r", 0, EncodeBatch(7, 0, 27, recs("9", 3))); !res.Duplicate || res.BaseOffset != 27 {
		t.Fatalf("retried batch 9: %+v", res)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	again := openTest(t, dir, nil)
	wantLost(t, again, "r", 0, [2]int64{21, 23})
	if vals, _ := readAround(t, again, "r", 0); len(vals) != 29 {
		t.Fatalf("after reopening: %d records", len(vals))
	}
}

// A flipped byte in the active segment after a SIGKILL, while the journal
// still holds the batch: it is repaired from the journal, and every
// acknowledged record is there.
func TestFlippedByteInActiveSegmentAfterKill(t *testing.T) {
	t.Parallel()
	dir := crashDir(t, 1<<20)
	// The child writes each batch out at once, for the damage to land in
	// bytes the segment holds.
	acks := runCrashChild(t, dir, 300, "RELAY_BROKER_CRASH_WRITEBACK=1")
	path := segmentName(partitionDir(dir, "crash", 0), 0, logSuffix)
	batches := segmentBatches(t, path)
	if len(batches) < 20 {
		t.Fatalf("partition 0 holds %d batches", len(batches))
	}
	victim := batches[len(batches)/2]
	flipByte(t, path, victim.pos+int64(victim.size)-5)
	logger, logs := captureLogs()
	r := openTest(t, dir, func(o *Options) { o.Logger = logger })
	checkCrashAcks(t, r, acks)
	for p := int32(0); p < crashPartitions; p++ {
		wantLost(t, r, "crash", p)
	}
	if len(logs.lines(t, "damaged batch repaired from the journal")) != 1 {
		t.Fatal("the repair was not logged")
	}
	m, _ := filepath.Glob(filepath.Join(partitionDir(dir, "crash", 0), "*"+cutInfix+"*"))
	if len(m) != 1 {
		t.Fatalf("damaged bytes not kept aside: %v", m)
	}
}

// writeSegments creates topic "i" with several small segments (dense
// indexes) and returns the data dir and the first segment's batches.
func writeSegments(t *testing.T) (string, []batchAt) {
	t.Helper()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.IndexIntervalBytes = 100 }, "i", TopicConfig{SegmentBytes: 4096})
	for i := 0; i < 60; i++ {
		mustAppend(t, b, "i", 0, EncodeBatch(5, 0, int32(i*3), recs(fmt.Sprint(i), 3)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if info, _ := Inspect(context.Background(), dir); info.Topics[0].Partitions[0].Segments < 3 {
		t.Fatalf("only %d segments", info.Topics[0].Partitions[0].Segments)
	}
	return dir, segmentBatches(t, segmentName(partitionDir(dir, "i", 0), 0, logSuffix))
}

// A flipped byte inside an inactive segment is not looked for on open (only
// the last batches are), but found by a read and by the background check,
// reported with its exact offsets, and never served as if the log ended.
func TestFlippedByteInInactiveSegment(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"read", "scrub", "background"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			dir, batches := writeSegments(t)
			victim := batches[3]
			flipByte(t, segmentName(partitionDir(dir, "i", 0), 0, logSuffix), victim.pos+60)
			logger, logs := captureLogs()
			b := openTest(t, dir, func(o *Options) {
				o.Logger = logger
				o.ScrubBytesPerSecond = -1
				if how == "background" {
					o.ScrubBytesPerSecond, o.ScrubPause = 1<<30, time.Millisecond
				}
			})
			switch how {
			case "read":
				wantLost(t, b, "i", 0)
				vals, errs := readAround(t, b, "i", 0)
				if len(vals) != 177 || len(errs) != 1 || KafkaErrorCode(errs[0]) != kerr.CorruptMessage.Code {
					t.Fatalf("read %d records and %v", len(vals), errs)
				}
			case "scrub":
				rep, err := b.Scrub(context.Background())
				if err != nil || rep.Lost != 1 || rep.Batches != 59 {
					t.Fatalf("scrub: %+v %v", rep, err)
				}
				if rep, _ := b.Scrub(context.Background()); rep.Lost != 0 {
					t.Fatalf("second pass reported again: %+v", rep)
				}
			case "background":
				testwait.For(t, 10*time.Second, "the background check to find the lost batch", func() bool {
					lost, _ := b.Lost("i", 0)
					return len(lost) > 0
				})
			}
			wantLost(t, b, "i", 0, [2]int64{victim.first, victim.last})
			logs.wantLostLogged(t, "i", 0, victim.first, victim.last)
			if _, err := b.Fetch(context.Background(), "i", 0, victim.first+1, 1<<20); !errors.Is(err, ErrDataLost) {
				t.Fatalf("fetch inside the lost range: %v", err)
			}
		})
	}
}

// Damage in an inactive segment's last batch is found on open.
func TestFlippedLastBatchOfInactiveSegmentFoundOnOpen(t *testing.T) {
	t.Parallel()
	dir, batches := writeSegments(t)
	victim := batches[len(batches)-1]
	flipByte(t, segmentName(partitionDir(dir, "i", 0), 0, logSuffix), victim.pos+60)
	logger, logs := captureLogs()
	b := openTest(t, dir, func(o *Options) { o.Logger = logger; o.ScrubBytesPerSecond = -1 })
	wantLost(t, b, "i", 0, [2]int64{victim.first, victim.last})
	logs.wantLostLogged(t, "i", 0, victim.first, victim.last)
}

// A partition directory deleted while the broker was stopped is reported
// lost: Open refuses and recreates nothing, unless told to go on, when the
// partition reports the loss.
func TestVanishedPartitionDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "v", TopicConfig{Partitions: 2})
	mustAppend(t, b, "v", 1, EncodeBatch(-1, -1, -1, recs("a", 3)))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	pdir := partitionDir(dir, "v", 1)
	if err := os.RemoveAll(pdir); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), Options{Dir: dir, Logger: quietLogger()})
	if !errors.Is(err, ErrPartitionLost) || !strings.Contains(err.Error(), "v/1") {
		t.Fatalf("open: %v", err)
	}
	if _, err := os.Stat(pdir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("partition directory recreated: %v", err)
	}
	ins, err := Inspect(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if l := ins.Topics[0].Partitions[1].Lost; len(l) != 1 || l[0].Last != -1 {
		t.Fatalf("inspect reports %+v", ins.Topics[0].Partitions[1])
	}
	logger, logs := captureLogs()
	r := openTest(t, dir, func(o *Options) { o.AllowLostPartitions = true; o.Logger = logger })
	lost, err := r.Lost("v", 1)
	if err != nil || len(lost) != 1 || lost[0].First != 0 || lost[0].Last != -1 {
		t.Fatalf("lost %+v %v", lost, err)
	}
	logs.wantLostLogged(t, "v", 1, 0, -1)
	if l, _ := r.Lost("v", 0); len(l) != 0 {
		t.Fatalf("partition 0 reports %+v", l)
	}
	mustAppend(t, r, "v", 1, EncodeBatch(-1, -1, -1, recs("b", 1)))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	again := openTest(t, dir, nil)
	if l, _ := again.Lost("v", 1); len(l) != 1 {
		t.Fatalf("the loss was forgotten: %+v", l)
	}
}

// Short writes and a full disk in the journal fail the append they hit
// and nothing else;
// an EIO on read fails the fetch with a storage error and reports nothing
// lost. None of them is sticky, and a crash afterwards loses nothing.
func TestWriteAndReadFaults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval, o.ScrubBytesPerSecond = ffs, -1, -1 }, "w", TopicConfig{})
	lp := &loadProducer{part: 0, pid: ProducerID{ID: 4}}
	appendOK := func() {
		t.Helper()
		if err := lp.append(b, "w"); err != nil {
			t.Fatalf("append: %v", err)
		}
	}
	appendFails := func(want error) {
		t.Helper()
		_, err := b.Append(context.Background(), "w", 0, lp.batch())
		if !errors.Is(err, ErrStorage) || !errors.Is(err, want) || errors.Is(err, ErrStorageFailed) {
			t.Fatalf("append over the fault: %v", err)
		}
		if err := b.Health(); err != nil {
			t.Fatalf("a write fault made the broker fail: %v", err)
		}
	}
	appendOK()
	// A segment's write fails no append: write-back (writeback.go) keeps
	// the bytes; TestWriteBackWriteFaults. The journal's write, in the
	// sync each append here waits for, fails the unsynced append it
	// carries (journal.go).
	ffs.inject(faultRule{op: opShort, suffix: journalSuffix, times: 1, err: syscall.ENOSPC})
	appendFails(syscall.ENOSPC)
	appendOK()
	ffs.inject(faultRule{op: opWrite, suffix: journalSuffix, after: 2, times: 1, err: syscall.ENOSPC})
	appendOK()
	appendOK()
	appendFails(syscall.ENOSPC)
	appendOK()

	writeOut(b) // the records on disk, for the fetch to read them there
	ffs.inject(faultRule{op: opRead, suffix: logSuffix, times: -1})
	_, err := b.Fetch(context.Background(), "w", 0, 0, 1<<20)
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.EIO) || KafkaErrorCode(err) != kerr.KafkaStorageError.Code {
		t.Fatalf("fetch over EIO: %v", err)
	}
	ffs.clear()
	wantLost(t, b, "w", 0)
	producers := []*loadProducer{lp}
	checkAcked(t, b, "w", producers)
	checkAcked(t, openTest(t, ffs.crashCopy(t, dir), nil), "w", producers)
}

// relay log dump no longer skips damaged batches silently: before the
// damage is known it stops with an error naming the segment and byte;
// once reported, it dumps around the lost range and then fails naming it.
func TestDumpReportsLostData(t *testing.T) {
	t.Parallel()
	dir, batches := writeSegments(t)
	victim := batches[3]
	flipByte(t, segmentName(partitionDir(dir, "i", 0), 0, logSuffix), victim.pos+60)
	var out bytes.Buffer
	err := Dump(context.Background(), &out, DumpOptions{DataDir: dir, Partition: -1, Format: "json"})
	if !errors.Is(err, ErrInvalidCRC) || !strings.Contains(err.Error(), fmt.Sprintf("at byte %d", victim.pos)) {
		t.Fatalf("dump over unreported damage: %v", err)
	}
	b := openTest(t, dir, func(o *Options) { o.ScrubBytesPerSecond = -1 })
	if _, err := b.Scrub(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = Dump(context.Background(), &out, DumpOptions{DataDir: dir, Partition: -1, Format: "json"})
	if !errors.Is(err, ErrDataLost) || !strings.Contains(err.Error(), fmt.Sprintf("offsets %d to %d", victim.first, victim.last)) {
		t.Fatalf("dump over reported damage: %v", err)
	}
	if n := strings.Count(out.String(), "\n"); n != 177 {
		t.Fatalf("dumped %d records, want 177", n)
	}
}

// Offsets that no file holds any more, with later ones still there, are a
// gap the partition reports: a fetch from below stops before it and the
// next one fails, instead of skipping it. The gap is found between the
// active segment and the journal, or between an inactive segment's end and
// the next segment.
func TestGapIsReported(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		segmentMs int64
	}{
		{"journal", 1 << 50},
		{"inactive segment", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			b := openTest(t, dir, nil)
			// Batch timestamps are from 2023: with the default segment.ms
			// the reopened broker rolls before appending c.
			mustCreate(t, b, "g", TopicConfig{SegmentMs: c.segmentMs})
			mustAppend(t, b, "g", 0, EncodeBatch(2, 0, 0, recs("a", 3)))
			mustAppend(t, b, "g", 0, EncodeBatch(2, 0, 3, recs("b", 3)))
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b = openTest(t, dir, nil)
			mustAppend(t, b, "g", 0, EncodeBatch(2, 0, 6, recs("c", 3)))
			mustAppend(t, b, "g", 0, EncodeBatch(2, 0, 9, recs("d", 3)))
			killed := t.TempDir()
			if out, err := exec.Command("cp", "-a", dir+"/.", killed).CombinedOutput(); err != nil {
				t.Fatalf("copy: %v: %s", err, out)
			}
			path := segmentName(partitionDir(killed, "g", 0), 0, logSuffix)
			if err := os.Truncate(path, int64(segmentBatches(t, path)[1].pos)); err != nil {
				t.Fatal(err)
			}
			logger, logs := captureLogs()
			r := openTest(t, killed, func(o *Options) { o.Logger = logger })
			wantLost(t, r, "g", 0, [2]int64{3, 5})
			logs.wantLostLogged(t, "g", 0, 3, 5)
			res, err := r.Fetch(context.Background(), "g", 0, 0, 1<<20)
			if end, _ := lastBatchEnd(res.Batches); err != nil || end != 3 {
				t.Fatalf("fetch from 0 served up to %d: %v", end, err)
			}
			vals, errs := readAround(t, r, "g", 0)
			if got := strings.Join(vals, ","); got != "a-v0,a-v1,a-v2,c-v0,c-v1,c-v2,d-v0,d-v1,d-v2" || len(errs) != 1 {
				t.Fatalf("read %s and %v", got, errs)
			}
		})
	}
}

// Damaged whole batches at the end of the active segment after a clean
// stop are cut aside, as a torn tail is, but reported lost with their
// offsets: nothing in the journal says they were never acknowledged. (The
// last batch is the one the recovery point's check reads, so its damage
// makes the open scan the whole segment; damage before a sound last batch
// is found by reads, TestDamageBeforeRecoveryPointAfterCleanStop.)
func TestDamagedTailAfterCleanStopIsReported(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		victims []int
		first   int64
	}{
		{"last batch", []int{9}, 27},
		{"last two batches", []int{8, 9}, 24},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir, path := writeBatches(t, 10)
			batches := segmentBatches(t, path)
			for _, v := range c.victims {
				flipByte(t, path, batches[v].pos+80)
			}
			logger, logs := captureLogs()
			b := openTest(t, dir, func(o *Options) { o.Logger = logger })
			wantLost(t, b, "r", 0, [2]int64{c.first, 29})
			logs.wantLostLogged(t, "r", 0, c.first, 29)
			if vals, errs := readAround(t, b, "r", 0); int64(len(vals)) != c.first || len(errs) != 1 || !errors.Is(errs[0], ErrDataLost) {
				t.Fatalf("read %d records and %v", len(vals), errs)
			}
			if cuts := cutFiles(t, dir); len(cuts) != 1 {
				t.Fatalf("cut files %v", cuts)
			}
			// The lost offsets are not handed out again, even after a
			// restart with nothing appended.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b = openTest(t, dir, nil)
			if res := mustAppend(t, b, "r", 0, EncodeBatch(-1, -1, -1, recs("new", 2))); res.BaseOffset != 30 {
				t.Fatalf("new append at %d", res.BaseOffset)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			again := openTest(t, dir, nil)
			wantLost(t, again, "r", 0, [2]int64{c.first, 29})
			vals, errs := readAround(t, again, "r", 0)
			if int64(len(vals)) != c.first+2 || len(errs) != 1 || vals[len(vals)-1] != "new-v1" {
				t.Fatalf("after reopening read %d records and %v", len(vals), errs)
			}
		})
	}
}

// Damage the background check found in the active segment, in batches the
// journal still holds, is repaired by the next open after a kill, and the
// report is withdrawn.
func TestReportedDamageRepairedFromJournalAfterKill(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.ScrubBytesPerSecond = -1 }, "k", TopicConfig{})
	var want []string
	for i := 0; i < 10; i++ {
		mustAppend(t, b, "k", 0, EncodeBatch(8, 0, int32(i*3), recs(fmt.Sprint(i), 3)))
		for j := 0; j < 3; j++ {
			want = append(want, fmt.Sprintf("%d-v%d", i, j))
		}
	}
	writeOut(b)
	path := segmentName(partitionDir(dir, "k", 0), 0, logSuffix)
	flipByte(t, path, segmentBatches(t, path)[5].pos+70)
	if rep, err := b.Scrub(context.Background()); err != nil || rep.Lost != 1 {
		t.Fatalf("scrub: %+v %v", rep, err)
	}
	wantLost(t, b, "k", 0, [2]int64{15, 17})
	killed := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", killed).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	logger, logs := captureLogs()
	r := openTest(t, killed, func(o *Options) { o.Logger = logger })
	wantLost(t, r, "k", 0)
	if got := strings.Join(values(t, r, "k", 0), ","); got != strings.Join(want, ",") {
		t.Fatalf("log holds %s", got)
	}
	if len(logs.lines(t, "damaged batch repaired from the journal")) != 1 {
		t.Fatal("the repair was not logged")
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wantLost(t, openTest(t, killed, nil), "k", 0)
}

// The background check reads a segment in chunks (scrubChunkBytes): damage
// in a batch that straddles a chunk's end, and in one that a chunk holds
// whole, is found with its exact offsets, and every other batch is checked
// once.
func TestScrubFindsDamageAcrossChunks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.ScrubBytesPerSecond = -1 }, "s", TopicConfig{})
	for i := range 1500 {
		mustAppend(t, b, "s", 0, EncodeBatch(3, 0, int32(i*3), recs(strings.Repeat("x", 200)+fmt.Sprint(i), 3)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	path := segmentName(partitionDir(dir, "s", 0), 0, logSuffix)
	batches := segmentBatches(t, path)
	var straddling, inside batchAt
	for _, ba := range batches {
		end := ba.pos + int64(ba.size)
		if ba.pos < scrubChunkBytes && end > scrubChunkBytes && straddling.size == 0 {
			straddling = ba
		}
		if ba.pos > 2*scrubChunkBytes+1000 && inside.size == 0 {
			inside = ba
		}
	}
	if straddling.size == 0 || inside.size == 0 {
		t.Fatalf("segment of %d batches too short for the test", len(batches))
	}
	flipByte(t, path, straddling.pos+int64(straddling.size)-3)
	flipByte(t, path, inside.pos+70)
	r := openTest(t, dir, func(o *Options) { o.ScrubBytesPerSecond = -1 })
	rep, err := r.Scrub(context.Background())
	if err != nil || rep.Lost != 2 || rep.Batches != int64(len(batches)-2) {
		t.Fatalf("scrub of %d batches: %+v %v", len(batches), rep, err)
	}
	wantLost(t, r, "s", 0, [2]int64{straddling.first, straddling.last}, [2]int64{inside.first, inside.last})
}
