package broker

import (
	"errors"
	"os"
	"syscall"
	"testing"
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
