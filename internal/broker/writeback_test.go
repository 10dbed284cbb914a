package broker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testwait"
)

// A full disk under the segments, with the journal still writable: every
// append is acknowledged (the journal made it durable), reads serve the
// bytes the segments could not take, the segment fsyncs that need them
// fail without failing the broker, the checkpoint keeps its journal files,
// and neither a machine crash then nor a reopen after the disk works again
// loses or doubles a record.
func TestWriteBackWriteFaults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval, o.ScrubBytesPerSecond = ffs, -1, -1 }, "w", TopicConfig{Partitions: 2})
	producers := []*loadProducer{{part: 0, pid: ProducerID{ID: 4}}, {part: 1, pid: ProducerID{ID: 5}}}
	appendAll := func(n int) {
		t.Helper()
		for range n {
			for _, lp := range producers {
				if err := lp.append(b, "w"); err != nil {
					t.Fatalf("append: %v", err)
				}
			}
		}
	}
	appendAll(5)
	writeOut(b)
	full := ffs.inject(faultRule{op: opShort, suffix: logSuffix, times: -1, err: syscall.ENOSPC})
	appendAll(20)
	writeOut(b)
	if full.firedCount(ffs) == 0 {
		t.Fatal("no segment write met the full disk")
	}
	checkAcked(t, b, "w", producers)

	err := b.partitionFor("w", 0).syncSegment()
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) || errors.Is(err, ErrStorageFailed) {
		t.Fatalf("segment fsync over a full disk: %v", err)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("a write fault made the broker fail: %v", err)
	}
	j := b.journal
	j.mu.Lock()
	if err := j.rotateLocked(-1); err != nil {
		t.Fatal(err)
	}
	j.mu.Unlock()
	if err := j.checkpoint(); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("checkpoint over a full disk: %v", err)
	}
	if nums, err := listJournals(OSFS{}, j.dir); err != nil || len(nums) < 2 {
		t.Fatalf("journal files after the failed checkpoint: %v %v", nums, err)
	}
	appendAll(5)
	checkAcked(t, b, "w", producers)
	checkAcked(t, openTest(t, ffs.crashCopy(t, dir), nil), "w", producers)

	ffs.clear()
	appendAll(5)
	if err := b.Close(); err != nil {
		t.Fatalf("close once the disk works: %v", err)
	}
	if nums, err := listJournals(OSFS{}, j.dir); err != nil || len(nums) != 0 {
		t.Fatalf("journal files after a clean close: %v %v", nums, err)
	}
	checkAcked(t, openTest(t, dir, nil), "w", producers)
}

// A SIGKILL while batches sit only in memory: the segments lack them, and
// the journal brings every acknowledged one back at its offset.
func TestWriteBackKilledWithBufferedBatches(t *testing.T) {
	t.Parallel()
	dir := crashDir(t, 1<<20)
	acks := runCrashChild(t, dir, 300)
	short := false
	for p := int32(0); p < crashPartitions; p++ {
		n := 0
		for _, a := range acks {
			if a.part == p {
				n++
			}
		}
		path := segmentName(partitionDir(dir, "crash", p), 0, logSuffix)
		if _, err := os.Stat(path); err == nil && len(segmentBatches(t, path)) < n {
			short = true
		}
	}
	if !short {
		t.Fatal("every acknowledged batch was in the segments: nothing was only in memory at the kill")
	}
	checkCrashAcks(t, openTest(t, dir, nil), acks)
}

// The bound holds the buffers' memory, not only the bytes in them: 500
// files taking turns to buffer a few hundred bytes each, as the segments
// of 1,000 topics do under a relay's backlog, never hold buffers of more
// capacity than the bound, every byte reaches its file in order, and a
// closed file gives its buffer's capacity back.
func TestWriteBackBoundCountsCapacity(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const limit, files, rounds = 64 << 10, 500, 40
	fsys := newWriteBackFS(OSFS{}, limit).(writeBackFS)
	fs := openWriteBackFiles(t, fsys, dir, files)
	want := make([][]byte, files)
	held := func() (caps int64) {
		for _, f := range fs {
			f.mu.Lock()
			caps += int64(cap(f.buf))
			f.mu.Unlock()
		}
		return caps
	}
	for r := range rounds {
		for i, f := range fs {
			b := make([]byte, 200+(i*7+r*13)%300)
			for k := range b {
				b[k] = byte(i + r + k)
			}
			if _, err := f.Write(b); err != nil {
				t.Fatal(err)
			}
			want[i] = append(want[i], b...)
			if i%50 == 0 {
				caps := held()
				fsys.pool.mu.Lock()
				counted := fsys.pool.buffered
				fsys.pool.mu.Unlock()
				if caps != counted || counted > limit {
					t.Fatalf("round %d file %d: buffers of %d bytes of capacity, %d counted, bound %d", r, i, caps, counted, limit)
				}
			}
		}
	}
	for i, f := range fs {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(segmentName(dir, int64(i), logSuffix))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("file %d holds %d bytes, %d were written, or not the same", i, len(got), len(want[i]))
		}
	}
	if fsys.pool.buffered != 0 || fsys.pool.dirty.Len() != 0 {
		t.Fatalf("after every file closed the pool counts %d bytes and %d dirty files", fsys.pool.buffered, fsys.pool.dirty.Len())
	}
}

// Past three quarters of the bound an append only wakes the write-back
// loop: the appender writes nothing to disk itself, and the loop then
// writes the files buffered longest until the pool is within five eighths
// of the bound, their bytes reaching the files in order.
func TestWriteBackLoopWritesDown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const limit, files = 64 << 10, 200
	fsys := newWriteBackFS(OSFS{}, limit).(writeBackFS)
	pool := fsys.pool
	buffered := func() int64 {
		pool.mu.Lock()
		defer pool.mu.Unlock()
		return pool.buffered
	}
	fs := openWriteBackFiles(t, fsys, dir, files)
	want := make([][]byte, files)
	for i := 0; buffered() <= limit/8*writeBackHigh; i++ {
		if i == 10*files {
			t.Fatalf("%d appends of 300 bytes left the pool at %d bytes", i, buffered())
		}
		b := bytes.Repeat([]byte{byte(i)}, 300)
		if _, err := fs[i%files].Write(b); err != nil {
			t.Fatal(err)
		}
		want[i%files] = append(want[i%files], b...)
	}
	if n := buffered(); n > limit {
		t.Fatalf("the pool holds %d bytes, past its bound %d", n, limit)
	}
	for i, f := range fs {
		if f.written != 0 {
			t.Fatalf("file %d: an append below the bound wrote %d bytes itself", i, f.written)
		}
	}
	if len(pool.wake) != 1 {
		t.Fatal("past three quarters of the bound, the write-back loop was not woken")
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); writeBackLoop(stop, pool) }()
	testwait.Until(t, 10*time.Second, "the write-back loop to flush the buffers", func() error {
		if n := buffered(); n > limit/8*writeBackLow {
			return fmt.Errorf("%d bytes buffered, want at most %d", n, limit/8*writeBackLow)
		}
		return nil
	})
	close(stop)
	<-done
	wrote := 0
	for i, f := range fs {
		got, err := os.ReadFile(segmentName(dir, int64(i), logSuffix))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			wrote++
		}
		if !bytes.HasPrefix(want[i], got) {
			t.Fatalf("file %d holds %d bytes that are not the first ones written to it", i, len(got))
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if got, _ := os.ReadFile(segmentName(dir, int64(i), logSuffix)); !bytes.Equal(got, want[i]) {
			t.Fatalf("file %d holds %d bytes after close, %d were written", i, len(got), len(want[i]))
		}
	}
	if wrote == 0 {
		t.Fatal("the write-back loop wrote no file")
	}
}

// openWriteBackFiles opens n segment files in dir for appending through
// fsys.
func openWriteBackFiles(t *testing.T, fsys writeBackFS, dir string, n int) []*writeBackFile {
	t.Helper()
	fs := make([]*writeBackFile, 0, n)
	for i := range n {
		f, err := fsys.OpenFile(segmentName(dir, int64(i), logSuffix), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f.(*writeBackFile))
	}
	return fs
}
