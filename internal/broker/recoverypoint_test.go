package broker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// readCountFS counts the bytes read from .log files, to show how much of a
// segment an open scanned; and the fsyncs of .log files and the recovery
// files opened for writing, to show what a close wrote.
type readCountFS struct {
	FS
	mu             sync.Mutex
	read           int64
	syncs, rpOpens int
}

func (c *readCountFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	switch {
	case err != nil:
	case strings.HasSuffix(name, logSuffix):
		return &readCountFile{File: f, fs: c}, nil
	case strings.HasSuffix(name, recoverySuffix) && flag&(os.O_WRONLY|os.O_RDWR) != 0:
		c.mu.Lock()
		c.rpOpens++
		c.mu.Unlock()
	}
	return f, err
}

func (c *readCountFS) bytesRead() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.read
}

// writes returns the fsyncs of .log files and the recovery files opened
// for writing so far.
func (c *readCountFS) writes() (syncs, rpOpens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncs, c.rpOpens
}

type readCountFile struct {
	File
	fs *readCountFS
}

func (f *readCountFile) Sync() error {
	f.fs.mu.Lock()
	f.fs.syncs++
	f.fs.mu.Unlock()
	return f.File.Sync()
}

func (f *readCountFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.mu.Lock()
	f.fs.read += int64(n)
	f.fs.mu.Unlock()
	return n, err
}

// timedRecs are n records whose timestamps grow with batch i, so that the
// time index has an entry for every indexed batch.
func timedRecs(i, n int) []Record {
	out := recs(fmt.Sprint(i), n)
	for j := range out {
		out[j].Timestamp = time.UnixMilli(1_700_000_000_000 + int64(i*100+j))
	}
	return out
}

// rpFixture is a broker killed (its directory copied while it runs, as a
// SIGKILL leaves it: the page cache holds every write) after before
// batches, a checkpoint of the segments (which writes the recovery point),
// and after more batches the journal alone made durable.
type rpFixture struct {
	dir     string // the killed copy
	seg     string // its partition 0's active segment
	batches []batchAt
	rp      int // index in batches of the first batch after the recovery point
	want    []string
}

func killAfterCheckpoint(t *testing.T, before, after, checkpoints int) rpFixture {
	t.Helper()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.IndexIntervalBytes = 1 }, "rp", TopicConfig{})
	var want []string
	n := 0
	for c := 0; c < checkpoints; c++ {
		for k := 0; k < before; k++ {
			mustAppend(t, b, "rp", 0, EncodeBatch(9, 0, int32(n*3), timedRecs(n, 3)))
			n++
		}
		if err := b.partitionFor("rp", 0).syncSegment(); err != nil {
			t.Fatal(err)
		}
	}
	rp := n
	for k := 0; k < after; k++ {
		mustAppend(t, b, "rp", 0, EncodeBatch(9, 0, int32(n*3), timedRecs(n, 3)))
		n++
	}
	for _, r := range readAll(t, b, "rp", 0) {
		want = append(want, string(r.Value))
	}
	// The batches after the point are written to the segment, not
	// fsynced, as a write-back flush leaves them, for the tests to damage
	// or cut.
	writeOut(b)
	killed := t.TempDir()
	if out, err := exec.Command("cp", "-a", dir+"/.", killed).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v: %s", err, out)
	}
	_ = os.Remove(filepath.Join(killed, "LOCK"))
	seg := segmentName(partitionDir(killed, "rp", 0), 0, logSuffix)
	if _, err := os.Stat(segmentName(partitionDir(killed, "rp", 0), 0, recoverySuffix)); err != nil {
		t.Fatalf("no recovery point written: %v", err)
	}
	return rpFixture{dir: killed, seg: seg, batches: segmentBatches(t, seg), rp: rp, want: want}
}

func (f rpFixture) open(t *testing.T, mod func(*Options)) (*Broker, *readCountFS, *logCapture) {
	t.Helper()
	counter := &readCountFS{FS: OSFS{}}
	logger, logs := captureLogs()
	b := openTest(t, f.dir, func(o *Options) {
		o.FS, o.Logger, o.IndexIntervalBytes, o.ScrubBytesPerSecond = counter, logger, 1, -1
		if mod != nil {
			mod(o)
		}
	})
	return b, counter, logs
}

// After a kill, the open scans the active segment only from the recovery
// point on (plus the batch before it, checked), and the index it rebuilds
// from the recovery file (three frames, each appending entries) answers
// offset and time lookups as a full scan's does.
func TestRecoveryPointLimitsTheScanAfterKill(t *testing.T) {
	t.Parallel()
	f := killAfterCheckpoint(t, 40, 5, 3)
	total := f.batches[len(f.batches)-1].pos + int64(f.batches[len(f.batches)-1].size)
	b, counter, _ := f.open(t, nil)
	read := counter.bytesRead()
	tail := total - f.batches[f.rp-1].pos
	if read > 3*tail || read >= total/4 {
		t.Fatalf("the open read %d bytes of a %d-byte segment whose last %d bytes follow (or end) the recovery point", read, total, tail)
	}
	if got := strings.Join(values(t, b, "rp", 0), ","); got != strings.Join(f.want, ",") {
		t.Fatalf("after the kill the log holds %s, want %s", got, strings.Join(f.want, ","))
	}
	var fromPoint []int64
	for i := 0; i < len(f.batches); i += 7 {
		off, _, err := b.OffsetForTime("rp", 0, time.UnixMilli(1_700_000_000_000+int64(i*100)+1))
		if err != nil {
			t.Fatal(err)
		}
		fromPoint = append(fromPoint, off)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The same lookups after a full scan (no recovery point).
	if err := os.Remove(segmentName(partitionDir(f.dir, "rp", 0), 0, recoverySuffix)); err != nil {
		t.Fatal(err)
	}
	full, counter, _ := f.open(t, nil)
	if read := counter.bytesRead(); read < total {
		t.Fatalf("without a recovery point the open read %d bytes of %d", read, total)
	}
	for k, i := 0, 0; i < len(f.batches); k, i = k+1, i+7 {
		off, _, err := full.OffsetForTime("rp", 0, time.UnixMilli(1_700_000_000_000+int64(i*100)+1))
		if err != nil {
			t.Fatal(err)
		}
		if off != fromPoint[k] || off != int64(i*3+1) {
			t.Fatalf("time lookup %d: %d after a full scan, %d from the recovery point, want %d", i, off, fromPoint[k], i*3+1)
		}
	}
}

// A torn tail after the recovery point is cut aside as without one, and
// nothing acknowledged is lost.
func TestTornTailAfterRecoveryPointIsCut(t *testing.T) {
	t.Parallel()
	f := killAfterCheckpoint(t, 20, 5, 1)
	tf, err := os.OpenFile(f.seg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	torn := EncodeBatch(9, 0, 75, recs("torn", 3))
	if _, err := tf.Write(torn[:len(torn)/2]); err != nil {
		t.Fatal(err)
	}
	tf.Close()
	b, _, _ := f.open(t, nil)
	if got := strings.Join(values(t, b, "rp", 0), ","); got != strings.Join(f.want, ",") {
		t.Fatalf("log holds %s", got)
	}
	m, _ := filepath.Glob(filepath.Join(partitionDir(f.dir, "rp", 0), "*"+cutInfix+"*"))
	if len(m) != 1 {
		t.Fatalf("torn tail not cut aside: %v", m)
	}
	wantLost(t, b, "rp", 0)
}

// A flipped byte after the recovery point is found on open and repaired
// from the journal, as without a recovery point.
func TestDamageAfterRecoveryPointRepairedFromJournal(t *testing.T) {
	t.Parallel()
	f := killAfterCheckpoint(t, 20, 6, 1)
	victim := f.batches[f.rp+2]
	flipByte(t, f.seg, victim.pos+int64(victim.size)-5)
	b, _, logs := f.open(t, nil)
	if got := strings.Join(values(t, b, "rp", 0), ","); got != strings.Join(f.want, ",") {
		t.Fatalf("log holds %s", got)
	}
	wantLost(t, b, "rp", 0)
	if len(logs.lines(t, "damaged batch repaired from the journal")) != 1 {
		t.Fatal("the repair was not logged")
	}
}

// A flipped byte before the recovery point is trusted by the open, as
// Kafka trusts what precedes its recovery point: the bytes were fsynced
// and are not read again. Reads and the background check verify every
// batch, so the damage is found there and reported with its exact
// offsets, never served.
func TestDamageBeforeRecoveryPointFoundByReadsAndScrub(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"read", "scrub"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := killAfterCheckpoint(t, 20, 5, 1)
			victim := f.batches[4]
			flipByte(t, f.seg, victim.pos+60)
			b, _, logs := f.open(t, nil)
			wantLost(t, b, "rp", 0)
			if how == "scrub" {
				if rep, err := b.Scrub(context.Background()); err != nil || rep.Lost != 1 {
					t.Fatalf("scrub: %+v %v", rep, err)
				}
				wantLost(t, b, "rp", 0, [2]int64{victim.first, victim.last})
			}
			vals, errs := readAround(t, b, "rp", 0)
			if len(vals) != len(f.want)-3 || len(errs) != 1 {
				t.Fatalf("read %d records and %v, want %d and one error", len(vals), errs, len(f.want)-3)
			}
			wantLost(t, b, "rp", 0, [2]int64{victim.first, victim.last})
			logs.wantLostLogged(t, "rp", 0, victim.first, victim.last)
		})
	}
}

// A recovery point that cannot be trusted means a full scan: a damaged or
// torn recovery file, one left beside a segment it does not describe (cut
// shorter, or rewritten with other batches), or a deleted one. The full
// scan finds a flipped byte before the point on open and the journal
// repairs it (the journal holds the whole segment here), which shows the
// point was not used.
func TestUnusableRecoveryPointMeansFullScan(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		spoil  func(t *testing.T, f rpFixture, rpFile string)
		logged bool
	}{
		{"flipped byte in the file", func(t *testing.T, f rpFixture, rpFile string) {
			st, _ := os.Stat(rpFile)
			flipByte(t, rpFile, st.Size()-3)
		}, true},
		{"torn file", func(t *testing.T, f rpFixture, rpFile string) {
			st, _ := os.Stat(rpFile)
			if err := os.Truncate(rpFile, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"deleted file", func(t *testing.T, f rpFixture, rpFile string) {
			if err := os.Remove(rpFile); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"segment cut below the point", func(t *testing.T, f rpFixture, rpFile string) {
			if err := os.Truncate(f.seg, f.batches[f.rp-2].pos); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"batch before the point replaced", func(t *testing.T, f rpFixture, rpFile string) {
			// Same offsets and size, other bytes, a good CRC: another
			// log than the one the point describes.
			at := f.batches[f.rp-1]
			other := EncodeBatch(8, 0, int32(at.first), timedRecs(f.rp-1, 3))
			setBaseOffset(other, at.first)
			if len(other) != at.size {
				t.Fatalf("replacement of %d bytes for %d", len(other), at.size)
			}
			sf, err := os.OpenFile(f.seg, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer sf.Close()
			if _, err := sf.WriteAt(other, at.pos); err != nil {
				t.Fatal(err)
			}
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := killAfterCheckpoint(t, 20, 5, 1)
			rpFile := segmentName(partitionDir(f.dir, "rp", 0), 0, recoverySuffix)
			victim := f.batches[3]
			flipByte(t, f.seg, victim.pos+60)
			c.spoil(t, f, rpFile)
			b, counter, logs := f.open(t, nil)
			if counter.bytesRead() < victim.pos {
				t.Fatalf("the open read %d bytes, so it did not scan from the start", counter.bytesRead())
			}
			wantLost(t, b, "rp", 0)
			if len(logs.lines(t, "damaged batch repaired from the journal")) != 1 {
				t.Fatal("the damage before the recovery point was not found on open")
			}
			if got := strings.Join(values(t, b, "rp", 0), ","); got != strings.Join(f.want, ",") {
				t.Fatalf("log holds %s", got)
			}
			if got := len(logs.lines(t, "recovery point unusable; scanning the whole active segment")); (got == 1) != c.logged {
				t.Fatalf("logged the unusable recovery point %d times", got)
			}
		})
	}
}

// A recovery file that cannot be written (a full disk, a failed fsync) is
// no storage failure: appends go on and are acknowledged, and the next open
// after a kill scans the whole segment and loses nothing.
func TestRecoveryPointWriteFailureIsHarmless(t *testing.T) {
	t.Parallel()
	for _, op := range []faultOp{opWrite, opSync} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			t.Parallel()
			fsys := newInjectFS()
			dir := t.TempDir()
			logger, logs := captureLogs()
			b := openWithTopic(t, dir, func(o *Options) { o.FS, o.Logger = fsys, logger }, "rp", TopicConfig{})
			fsys.inject(faultRule{op: op, suffix: recoverySuffix, times: -1, err: syscall.ENOSPC})
			var want []string
			for i := 0; i < 30; i++ {
				mustAppend(t, b, "rp", 0, EncodeBatch(9, 0, int32(i*3), recs(fmt.Sprint(i), 3)))
				if i == 15 {
					if err := b.partitionFor("rp", 0).syncSegment(); err != nil {
						t.Fatalf("checkpoint: %v", err)
					}
				}
			}
			if err := b.Health(); err != nil {
				t.Fatalf("health after a failed recovery point write: %v", err)
			}
			if len(logs.lines(t, "writing the recovery point failed; the next open after a crash scans more of the active segment")) != 1 {
				t.Fatal("the failure was not logged")
			}
			want = values(t, b, "rp", 0)
			killed := t.TempDir()
			if out, err := exec.Command("cp", "-a", dir+"/.", killed).CombinedOutput(); err != nil {
				t.Fatalf("copy: %v: %s", err, out)
			}
			_ = os.Remove(filepath.Join(killed, "LOCK"))
			r := openTest(t, killed, nil)
			if got := strings.Join(values(t, r, "rp", 0), ","); got != strings.Join(want, ",") || len(want) != 90 {
				t.Fatalf("after the kill: %s", got)
			}
		})
	}
}

// A clean stop writes a recovery point at the log end, with the producer
// state as of the end, so the next open reads the last batch of the active
// segment (checked) once and nothing else of the segment.
func TestCleanStopOpensFromRecoveryPoint(t *testing.T) {
	t.Parallel()
	dir, path := writeBatches(t, 50)
	batches := segmentBatches(t, path)
	counter := &readCountFS{FS: OSFS{}}
	b := openTest(t, dir, func(o *Options) { o.FS, o.ScrubBytesPerSecond = counter, -1 })
	last := batches[len(batches)-1]
	total := last.pos + int64(last.size)
	if read := counter.bytesRead(); read != int64(last.size) {
		t.Fatalf("the open read %d bytes of a %d-byte segment, want its last batch's %d", read, total, last.size)
	}
	if n := len(values(t, b, "r", 0)); n != 150 {
		t.Fatalf("%d records", n)
	}
}

// TestIdleCloseSyncsNothing: a close with nothing appended since the
// recovery point at the segment's end fsyncs nothing and writes no frame;
// one with an append fsyncs the segment and writes a frame, and the next
// open starts from it.
func TestIdleCloseSyncsNothing(t *testing.T) {
	t.Parallel()
	dir, _ := writeBatches(t, 20)
	pdir := partitionDir(dir, "r", 0)
	closeCounting := func(appends int) (syncs, dirSyncs, rpOpens int) {
		t.Helper()
		dirs := &syncCountFS{FS: OSFS{}}
		counter := &readCountFS{FS: dirs}
		b, err := Open(context.Background(), Options{Dir: dir, JanitorInterval: -1, ScrubBytesPerSecond: -1, Logger: quietLogger(), FS: counter})
		if err != nil {
			t.Fatal(err)
		}
		for i := range appends {
			mustAppend(t, b, "r", 0, EncodeBatch(7, 0, int32(60+i*3), recs(fmt.Sprint("more", i), 3)))
		}
		s0, r0 := counter.writes()
		d0 := dirs.dirSyncsOf(pdir)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		s1, r1 := counter.writes()
		return s1 - s0, dirs.dirSyncsOf(pdir) - d0, r1 - r0
	}
	for round := range 2 {
		if syncs, dirSyncs, rpOpens := closeCounting(0); syncs != 0 || dirSyncs != 0 || rpOpens != 0 {
			t.Fatalf("round %d: an idle close made %d segment fsyncs and %d directory fsyncs and wrote %d recovery frames, want none",
				round, syncs, dirSyncs, rpOpens)
		}
	}
	if syncs, _, rpOpens := closeCounting(1); syncs == 0 || rpOpens != 1 {
		t.Fatalf("a close after an append made %d segment fsyncs and wrote %d recovery frames, want an fsync and one frame", syncs, rpOpens)
	}
	counter := &readCountFS{FS: OSFS{}}
	b := openTest(t, dir, func(o *Options) { o.FS, o.ScrubBytesPerSecond = counter, -1 })
	if read, last := counter.bytesRead(), int64(len(EncodeBatch(7, 0, 60, recs("more0", 3)))); read != last {
		t.Fatalf("the open read %d bytes, want the last batch's %d", read, last)
	}
	if n := len(values(t, b, "r", 0)); n != 63 {
		t.Fatalf("%d records after the closes, want 63", n)
	}
}

// Damaged batches before the recovery point a clean stop wrote, good ones
// after them: the open trusts them (only the last batch is checked), a read
// finds them, reports them lost with their offsets and serves the batches
// after them; nothing is cut.
func TestDamageBeforeRecoveryPointAfterCleanStop(t *testing.T) {
	t.Parallel()
	dir, path := writeBatches(t, 10)
	batches := segmentBatches(t, path)
	for _, v := range []int{7, 8} {
		flipByte(t, path, batches[v].pos+80)
	}
	logger, logs := captureLogs()
	b := openTest(t, dir, func(o *Options) { o.Logger, o.ScrubBytesPerSecond = logger, -1 })
	wantLost(t, b, "r", 0)
	vals, errs := readAround(t, b, "r", 0)
	if len(vals) != 24 || len(errs) != 1 || vals[len(vals)-1] != "9-v2" {
		t.Fatalf("read %d records and %v", len(vals), errs)
	}
	wantLost(t, b, "r", 0, [2]int64{21, 26})
	logs.wantLostLogged(t, "r", 0, 21, 26)
	if cuts := cutFiles(t, dir); len(cuts) != 0 {
		t.Fatalf("cut files %v", cuts)
	}
}

// slowSyncFS makes every fsync of a segment take a while, to widen races
// with it.
type slowSyncFS struct{ FS }

func (f slowSyncFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil || !strings.HasSuffix(name, logSuffix) {
		return file, err
	}
	return slowSyncFile{file}, nil
}

type slowSyncFile struct{ File }

func (f slowSyncFile) Sync() error {
	time.Sleep(5 * time.Millisecond) // deliberate pause: a slow fsync, the fault under test
	return f.File.Sync()
}

// A checkpoint still fsyncing segments while the broker closes (Close
// closes the partitions before it stops the checkpoint) waits for Close or
// finds the partition closed; it never fsyncs a file Close closed (a nil
// file: seen as a panic in the broker bench before the fix, and as a data
// race under -race).
func TestCheckpointDuringClose(t *testing.T) {
	t.Parallel()
	for round := 0; round < 5; round++ {
		b := openWithTopic(t, t.TempDir(), func(o *Options) { o.FS = slowSyncFS{OSFS{}} }, "c", TopicConfig{Partitions: 16})
		var parts []*partition
		for p := int32(0); p < 16; p++ {
			mustAppend(t, b, "c", p, EncodeBatch(-1, -1, -1, recs(fmt.Sprint(p), 2)))
			parts = append(parts, b.partitionFor("c", p))
		}
		var wg sync.WaitGroup
		for _, p := range parts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.syncSegment(); err != nil {
					t.Errorf("checkpoint during close: %v", err)
				}
			}()
		}
		time.Sleep(time.Millisecond) // deliberate pause: the checkpoints start before Close
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}
