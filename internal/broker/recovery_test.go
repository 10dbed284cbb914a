package broker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// crashBatch is deterministic so the parent can rebuild exactly the batch
// the child sent and retry it.
func crashBatch(pid int64, epoch int16, part int32, seq int32) []byte {
	rs := make([]Record, 4)
	for i := range rs {
		v := fmt.Sprintf("e%d-p%d-s%d", epoch, part, seq+int32(i))
		rs[i] = Record{Key: []byte(v), Value: []byte(v), Timestamp: time.UnixMilli(1_700_000_000_000)}
	}
	return EncodeBatch(pid, epoch, seq, rs)
}

const crashPartitions = 4

// crashDir is a closed data directory holding the topic the crash child
// appends to, with segments of segmentBytes.
func crashDir(t *testing.T, segmentBytes int64) string {
	t.Helper()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "crash", TopicConfig{Partitions: crashPartitions, SegmentBytes: segmentBytes})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCrashChild is the child side of TestKillDuringAppend; it only runs
// when re-executed with RELAY_BROKER_CRASH_DIR set.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("RELAY_BROKER_CRASH_DIR")
	if dir == "" {
		t.Skip("helper process for TestKillDuringAppend")
	}
	opts := Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()}
	if v := os.Getenv("RELAY_BROKER_CRASH_WRITEBACK"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			fmt.Println("RELAY_BROKER_CRASH_WRITEBACK:", err)
			os.Exit(2)
		}
		opts.WriteBackBytes = n
	}
	b, err := Open(context.Background(), opts)
	if err != nil {
		fmt.Println("open error", err)
		os.Exit(2)
	}
	if _, err := b.EnsureTopic("crash"); err != nil {
		fmt.Println("topic error", err)
		os.Exit(2)
	}
	pid, err := b.InitProducerID(context.Background(), "crash-relay")
	if err != nil {
		os.Exit(2)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for p := int32(0); p < crashPartitions; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int32(0); ; seq += 4 {
				res, err := b.Append(context.Background(), "crash", p, crashBatch(pid.ID, pid.Epoch, p, seq))
				if err != nil {
					os.Exit(3)
				}
				mu.Lock()
				fmt.Fprintf(out, "ack %d %d %d %d %d\n", pid.ID, pid.Epoch, p, seq, res.BaseOffset)
				_ = out.Flush()
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// crashAck is one batch the crash child acknowledged.
type crashAck struct {
	pid   int64
	epoch int16
	part  int32
	seq   int32
	base  int64
}

// runCrashChild runs TestCrashChild on dir and SIGKILLs it once it has
// acknowledged kill batches, returning every batch it acknowledged. env
// adds to the child's environment: RELAY_BROKER_CRASH_WRITEBACK=N sets its
// Options.WriteBackBytes (1 writes each batch out at once).
func runCrashChild(t *testing.T, dir string, kill int, env ...string) []crashAck {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), "RELAY_BROKER_CRASH_DIR="+dir), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acks []crashAck
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		var a crashAck
		if _, err := fmt.Sscanf(sc.Text(), "ack %d %d %d %d %d", &a.pid, &a.epoch, &a.part, &a.seq, &a.base); err != nil {
			t.Fatalf("child said %q", sc.Text())
		}
		acks = append(acks, a)
		if len(acks) == kill {
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	// Lines still in the pipe were acknowledged before the kill too: the
	// scan above reads them all, so the last ack per partition is really
	// the child's last one.
	_ = cmd.Wait()
	if len(acks) < kill {
		t.Fatalf("child acknowledged only %d batches", len(acks))
	}
	return acks
}

// checkCrashAcks verifies that b holds every acknowledged record once, at
// its acknowledged offset, and that retrying each partition's last batch
// of the newest epoch is recognised as a duplicate.
func checkCrashAcks(t *testing.T, b *Broker, acks []crashAck) {
	t.Helper()
	for p := int32(0); p < crashPartitions; p++ {
		seen := map[string]int64{}
		for _, r := range readAll(t, b, "crash", p) {
			if prev, dup := seen[string(r.Value)]; dup {
				t.Fatalf("partition %d: %s at %d and %d", p, r.Value, prev, r.Offset)
			}
			seen[string(r.Value)] = r.Offset
		}
		lastEpoch := int16(-1)
		for _, a := range acks {
			if a.part == p && a.epoch > lastEpoch {
				lastEpoch = a.epoch
			}
		}
		for _, a := range acks {
			if a.part != p {
				continue
			}
			for i := int32(0); i < 4; i++ {
				v := fmt.Sprintf("e%d-p%d-s%d", a.epoch, p, a.seq+i)
				if off, ok := seen[v]; !ok {
					t.Fatalf("acknowledged record %s lost", v)
				} else if off != a.base+int64(i) {
					t.Fatalf("record %s at %d, acknowledged at %d", v, off, a.base+int64(i))
				}
			}
		}
		var last crashAck
		for _, a := range acks {
			if a.part == p && a.epoch == lastEpoch {
				last = a
			}
		}
		res, err := b.Append(context.Background(), "crash", p, crashBatch(last.pid, last.epoch, p, last.seq))
		if err != nil || !res.Duplicate || res.BaseOffset != last.base {
			t.Fatalf("partition %d retry of seq %d: %+v %v (acked at %d)", p, last.seq, res, err, last.base)
		}
	}
}

func TestKillDuringAppend(t *testing.T) {
	t.Parallel()
	dir := crashDir(t, 16<<10)
	var acks []crashAck
	// The first child buffers its segments' bytes (writeback.go), so the
	// kill loses them from the segments and the journal brings them back;
	// the second writes each batch out at once, so the kill leaves them
	// in the page cache; the third's bound is small enough that the
	// write-back loop writes buffers out beside the appends when it dies.
	for round, wb := range []string{"0", "1", "8192"} {
		acks = append(acks, runCrashChild(t, dir, 300+round*97, "RELAY_BROKER_CRASH_WRITEBACK="+wb)...)
	}
	checkCrashAcks(t, openTest(t, dir, nil), acks)
}

// writeBatches creates a one-partition topic with n batches of 3 records
// and returns the data dir and the active segment path.
func writeBatches(t *testing.T, n int) (string, string) {
	t.Helper()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "r", TopicConfig{})
	for i := 0; i < n; i++ {
		mustAppend(t, b, "r", 0, EncodeBatch(7, 0, int32(i*3), recs(fmt.Sprint(i), 3)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return dir, segmentName(partitionDir(dir, "r", 0), 0, logSuffix)
}

func cutFiles(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(partitionDir(dir, "r", 0), "*"+cutInfix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCorruptTailRecovery(t *testing.T) {
	t.Parallel()
	batchSize := len(EncodeBatch(7, 0, 0, recs("0", 3)))
	cases := []struct {
		name      string
		damage    func(t *testing.T, path string)
		wantCount int // records left
		cutBytes  int
	}{
		{"truncate mid batch", func(t *testing.T, path string) {
			st, _ := os.Stat(path)
			if err := os.Truncate(path, st.Size()-int64(batchSize/2)); err != nil {
				t.Fatal(err)
			}
		}, 27, batchSize - batchSize/2},
		{"zero filled tail", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(make([]byte, 4096)); err != nil {
				t.Fatal(err)
			}
		}, 30, 4096},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir, path := writeBatches(t, 10)
			c.damage(t, path)
			b := openTest(t, dir, nil)
			got := readAll(t, b, "r", 0)
			if len(got) != c.wantCount {
				t.Fatalf("%d records after recovery, want %d", len(got), c.wantCount)
			}
			cuts := cutFiles(t, dir)
			if len(cuts) != 1 {
				t.Fatalf("cut files: %v", cuts)
			}
			if st, _ := os.Stat(cuts[0]); st.Size() != int64(c.cutBytes) {
				t.Fatalf("cut file has %d bytes, want %d", st.Size(), c.cutBytes)
			}
			// Producer state follows the log: the next sequence continues
			// after the last surviving batch.
			res := mustAppend(t, b, "r", 0, EncodeBatch(7, 0, int32(c.wantCount), recs("new", 2)))
			if res.BaseOffset != int64(c.wantCount) {
				t.Fatalf("new append at %d", res.BaseOffset)
			}
			got = readAll(t, b, "r", 0)
			if len(got) != c.wantCount+2 || string(got[len(got)-1].Value) != "new-v1" {
				t.Fatalf("after append: %d records", len(got))
			}
		})
	}
}

func TestIndexRebuild(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, func(o *Options) { o.IndexIntervalBytes = 100 }, "r", TopicConfig{SegmentBytes: 4096})
	for i := 0; i < 100; i++ {
		mustAppend(t, b, "r", 0, EncodeBatch(-1, -1, -1, recs(fmt.Sprint(i), 2)))
	}
	_ = b.Close()
	pdir := partitionDir(dir, "r", 0)
	idx, _ := filepath.Glob(filepath.Join(pdir, "*"+indexSuffix))
	if len(idx) < 3 {
		t.Fatalf("index files: %v", idx)
	}
	_ = os.Remove(idx[0])
	_ = os.WriteFile(idx[1], []byte("garbage"), 0o644)
	b2 := openTest(t, dir, nil)
	got := readAll(t, b2, "r", 0)
	if len(got) != 200 {
		t.Fatalf("%d records", len(got))
	}
	for i, r := range got {
		if r.Offset != int64(i) {
			t.Fatalf("record %d has offset %d", i, r.Offset)
		}
	}
	if _, err := os.Stat(idx[0]); err != nil {
		t.Fatalf("index not rebuilt: %v", err)
	}
}

// faultFS fails, on demand, writes (half written, then ENOSPC, like a
// full disk), fsyncs and truncates (EIO) of the files whose names end in
// one of suffixes.
type faultFS struct {
	OSFS
	suffixes     []string
	failWrite    atomic.Bool
	failSync     atomic.Bool
	failTruncate atomic.Bool
}

type faultFile struct {
	File
	fs      *faultFS
	watched bool
}

func (f *faultFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	watched := slices.ContainsFunc(f.suffixes, func(suffix string) bool { return strings.HasSuffix(name, suffix) })
	return &faultFile{File: file, fs: f, watched: watched}, nil
}

func (f *faultFile) Write(p []byte) (int, error) {
	if f.watched && f.fs.failWrite.Load() {
		n, _ := f.File.Write(p[:len(p)/2])
		return n, syscall.ENOSPC
	}
	return f.File.Write(p)
}

func (f *faultFile) Sync() error {
	if f.watched && f.fs.failSync.Load() {
		return syscall.EIO
	}
	return f.File.Sync()
}

func (f *faultFile) Truncate(size int64) error {
	if f.watched && f.fs.failTruncate.Load() {
		return syscall.EIO
	}
	return f.File.Truncate(size)
}

func TestDiskFaults(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := &faultFS{suffixes: []string{logSuffix, journalSuffix}}
	b := openWithTopic(t, dir, func(o *Options) { o.FS = ffs }, "f", TopicConfig{})
	mustAppend(t, b, "f", 0, EncodeBatch(9, 0, 0, recs("a", 2)))

	ffs.failWrite.Store(true)
	_, err := b.Append(context.Background(), "f", 0, EncodeBatch(9, 0, 2, recs("b", 2)))
	if !errors.Is(err, ErrStorage) || !errors.Is(err, syscall.ENOSPC) || KafkaErrorCode(err) != 56 {
		t.Fatalf("write fault: %v", err)
	}
	ffs.failWrite.Store(false)
	if res := mustAppend(t, b, "f", 0, EncodeBatch(9, 0, 2, recs("b", 2))); res.BaseOffset != 2 {
		t.Fatalf("after write fault: %+v", res)
	}

	// A failed fsync is sticky: the waiting appends fail, and so does
	// every later one, even once the disk works, until the broker was
	// reopened from disk.
	ffs.failSync.Store(true)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = b.Append(context.Background(), "f", 0, EncodeBatch(int64(100+i), 0, 0, recs("c", 1)))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if !errors.Is(err, ErrStorage) {
			t.Fatalf("fsync fault acknowledged: %v", err)
		}
	}
	if _, hw, _ := b.Offsets("f", 0); hw != 4 {
		t.Fatalf("hw %d after failed fsync", hw)
	}
	ffs.failSync.Store(false)
	if err := b.Health(); !errors.Is(err, ErrStorageFailed) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("health after a failed fsync: %v", err)
	}
	_, err = b.Append(context.Background(), "f", 0, EncodeBatch(9, 0, 4, recs("d", 2)))
	if !errors.Is(err, ErrStorageFailed) || KafkaErrorCode(err) != 56 {
		t.Fatalf("append after a failed fsync, before reopening: %v", err)
	}
	if err := b.Reopen(context.Background()); err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health after reopening: %v", err)
	}
	if res := mustAppend(t, b, "f", 0, EncodeBatch(9, 0, 4, recs("d", 2))); res.Duplicate {
		t.Fatalf("after fsync fault: %+v", res)
	}
	// Producer 100's batch was never acknowledged: the replayed journal
	// may have brought it back (then the retry is a duplicate) or not.
	mustAppend(t, b, "f", 0, EncodeBatch(100, 0, 0, recs("c", 1)))
	check := func(b *Broker) {
		t.Helper()
		counts := map[string]int{}
		for _, r := range readAll(t, b, "f", 0) {
			counts[string(r.Value)]++
		}
		for _, v := range []string{"a-v0", "a-v1", "b-v0", "b-v1", "d-v0", "d-v1"} {
			if counts[v] != 1 {
				t.Fatalf("log holds %s %d times: %v", v, counts[v], counts)
			}
		}
		if counts["c-v0"] < 1 {
			t.Fatalf("log lost the retried batch: %v", counts)
		}
	}
	check(b)
	_ = b.Close()
	check(openTest(t, dir, nil))
}
