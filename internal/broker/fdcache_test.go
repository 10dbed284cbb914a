package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// countFS counts the segment files open for appending, and the most at
// once.
type countFS struct {
	OSFS
	mu        sync.Mutex
	open, max int
}

type countedFile struct {
	File
	fs   *countFS
	once sync.Once
}

func (c *countFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := c.OSFS.OpenFile(name, flag, perm)
	if err != nil || flag&os.O_APPEND == 0 || !isSegmentLog(name) {
		return f, err
	}
	c.mu.Lock()
	c.open++
	c.max = max(c.max, c.open)
	c.mu.Unlock()
	return &countedFile{File: f, fs: c}, nil
}

func (f *countedFile) Close() error {
	f.once.Do(func() {
		f.fs.mu.Lock()
		f.fs.open--
		f.fs.mu.Unlock()
	})
	return f.File.Close()
}

func (c *countFS) peak(reset bool) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.max
	if reset {
		c.max = c.open
	}
	return m
}

// TestMaxOpenFilesBoundsSegmentDescriptors appends to and reads 40
// partitions with MaxOpenFiles 4, across a reopen: at most 4 segment files
// are open for appending while they are used one at a time, and every
// record is read back, before and after the reopen.
func TestMaxOpenFilesBoundsSegmentDescriptors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fsys := &countFS{}
	// No background check: its reads are concurrent callers, which may
	// hold a file past the bound while they last.
	mod := func(o *Options) { o.FS, o.MaxOpenFiles, o.ScrubBytesPerSecond = fsys, 4, -1 }
	const parts = 40
	b := openWithTopic(t, dir, mod, "t", TopicConfig{Partitions: parts})
	fsys.peak(true)
	for round := 0; round < 3; round++ {
		for p := int32(0); p < parts; p++ {
			mustAppend(t, b, "t", p, EncodeBatch(-1, 0, 0, recs(fmt.Sprintf("r%d-p%d", round, p), 5)))
		}
	}
	check := func(when string) {
		for p := int32(0); p < parts; p++ {
			got := readAll(t, b, "t", p)
			if len(got) != 15 || string(got[14].Value) != fmt.Sprintf("r2-p%d-v4", p) {
				t.Fatalf("%s: partition %d: %d records, want 15 ending r2-p%d-v4", when, p, len(got), p)
			}
		}
	}
	check("before the reopen")
	if m := fsys.peak(true); m > 4 {
		t.Fatalf("%d segment files open at once, want at most 4", m)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTest(t, dir, mod)
	// Open runs up to openParallelism partitions at once, each holding
	// its file while it recovers.
	if m := fsys.peak(true); m > 4+openParallelism {
		t.Fatalf("%d segment files open at once during Open, want at most %d", m, 4+openParallelism)
	}
	check("after the reopen")
	fsys.peak(true)
	check("after the reopen, again")
	mustAppend(t, b, "t", 7, EncodeBatch(-1, 0, 0, recs("after", 1)))
	if m := fsys.peak(false); m > 4 {
		t.Fatalf("%d segment files open at once after the reopen, want at most 4", m)
	}
}

// TestFailedEvictionFsyncIsReported fails the fsync that precedes closing
// an idle segment file: the broker must report the storage failure at its
// next fsync of that partition (here Close), as if its own fsync had
// failed, and after a reopen (which replays the journal) every
// acknowledged record is there.
func TestFailedEvictionFsyncIsReported(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fsys := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.MaxOpenFiles, o.ReopenInterval = fsys, 2, -1 }, "t", TopicConfig{Partitions: 3})
	mustAppend(t, b, "t", 0, EncodeBatch(-1, 0, 0, recs("a", 3)))
	writeOut(b) // the batch in the file, not fsynced
	rule := fsys.inject(faultRule{op: opSync, suffix: ".log", times: 1, err: syscall.EIO})
	// Partitions 1 and 2 make partition 0's file the least recently used
	// past the bound of 2: it is fsynced (failing) and closed.
	mustAppend(t, b, "t", 1, EncodeBatch(-1, 0, 0, recs("b", 3)))
	writeOut(b)
	mustAppend(t, b, "t", 2, EncodeBatch(-1, 0, 0, recs("c", 3)))
	writeOut(b)
	if rule.firedCount(fsys) != 1 {
		t.Fatalf("the eviction's fsync was not attempted (fired %d)", rule.firedCount(fsys))
	}
	// Under SyncBeforeAck the journal's fsync acknowledged the appends;
	// the segment's own fsync comes at a checkpoint or on Close, which
	// must fail and keep the journal.
	if err := b.Close(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Close after a failed eviction fsync: %v, want EIO", err)
	}
	fsys.clear()
	b = openTest(t, dir, func(o *Options) { o.FS, o.MaxOpenFiles = fsys, 2 })
	for p, prefix := range []string{"a", "b", "c"} {
		got := readAll(t, b, "t", int32(p))
		if len(got) != 3 || string(got[2].Value) != prefix+"-v2" {
			t.Fatalf("partition %d after reopen: %d records, want 3 ending %s-v2", p, len(got), prefix)
		}
	}
}

func TestIsSegmentLog(t *testing.T) {
	for name, want := range map[string]bool{
		"/d/topics/t/0/00000000000000001234.log":   true,
		"/d/groups/offsets.log":                    false,
		"/d/topics/t/0/00000000000000001234.index": false,
		"/d/topics/t/0/0000000000000000123x.log":   false,
		"/d/journal/000.journal":                   false,
	} {
		if got := isSegmentLog(name); got != want {
			t.Errorf("isSegmentLog(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestReopenRefusesAReplacedFile: a segment file replaced under its name
// while its descriptor was closed (as compaction renames a cleaned
// segment over the original) is not read through the pooled file.
func TestReopenRefusesAReplacedFile(t *testing.T) {
	dir := t.TempDir()
	fsys := newPooledFS(OSFS{}, 1)
	a, b := segmentName(dir, 0, logSuffix), segmentName(dir, 100, logSuffix)
	fa, err := fsys.OpenFile(a, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fa.Write([]byte("original")); err != nil {
		t.Fatal(err)
	}
	// Opening b evicts a (bound 1).
	fb, err := fsys.OpenFile(b, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if err := os.WriteFile(a+".cleaned", []byte("replaced"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(a+".cleaned", a); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if n, err := fa.ReadAt(buf, 0); err == nil {
		t.Fatalf("read %q through a file replaced while evicted, want an error", buf[:n])
	}
}

// TestBusyLeastRecentlyUsedFileIsPassedOver opens three segment files
// under a bound of 2 while the least recently used one is in use: the
// pool closes the next idle one instead, so no more than 2 are open, and
// the busy one keeps its descriptor.
func TestBusyLeastRecentlyUsedFileIsPassedOver(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fsys := &countFS{}
	pool := newPooledFS(fsys, 2)
	open := func(sub string) *pooledFile {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := pool.OpenFile(filepath.Join(dir, sub, "00000000000000000000.log"), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		return f.(*pooledFile)
	}
	a, b := open("a"), open("b")
	a.mu.Lock() // a is in use, as during a reader's ReadAt
	c := open("c")
	a.mu.Unlock()
	if m := fsys.peak(false); m > 2 {
		t.Fatalf("%d segment files open at once, want at most 2", m)
	}
	if a.f == nil || b.f != nil || c.f == nil {
		t.Fatalf("open descriptors a=%t b=%t c=%t, want a and c open, b closed", a.f != nil, b.f != nil, c.f != nil)
	}
	if _, err := b.Write([]byte("x")); err != nil {
		t.Fatalf("write to the closed file reopens it: %v", err)
	}
}
