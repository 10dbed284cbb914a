package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// syncCountFS counts directory fsyncs and renames over meta.json.
type syncCountFS struct {
	FS
	mu                sync.Mutex
	dirSyncs, metaRen int
	byDir             map[string]int
}

func (c *syncCountFS) SyncDir(dir string) error {
	c.mu.Lock()
	c.dirSyncs++
	if c.byDir == nil {
		c.byDir = map[string]int{}
	}
	c.byDir[dir]++
	c.mu.Unlock()
	return c.FS.SyncDir(dir)
}

func (c *syncCountFS) dirSyncsOf(dir string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byDir[dir]
}

func (c *syncCountFS) Rename(from, to string) error {
	if filepath.Base(to) == metaFile {
		c.mu.Lock()
		c.metaRen++
		c.mu.Unlock()
	}
	return c.FS.Rename(from, to)
}

func (c *syncCountFS) counts() (int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dirSyncs, c.metaRen
}

// EnsureTopics creates many topics with one meta.json write and one fsync
// of DIR/topics, each topic's directories fsynced, and every topic is
// there after a reopen; a bad name is refused by name and does not stop
// the others; existing topics are left as they are.
func TestEnsureTopicsCreatesManyWithOneMetadataWrite(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	counter := &syncCountFS{FS: OSFS{}}
	b := openTest(t, dir, func(o *Options) { o.FS, o.DefaultPartitions = counter, 3 })
	mustCreate(t, b, "old", TopicConfig{Partitions: 1})
	mustAppend(t, b, "old", 0, EncodeBatch(-1, -1, -1, recs("x", 2)))
	dirs0, meta0 := counter.counts()
	var names []string
	for i := 0; i < 40; i++ {
		names = append(names, fmt.Sprintf("t%02d", i))
	}
	names = append(names, "old", "bad/name", "t00")
	err := b.EnsureTopics(names)
	if err == nil || !errors.Is(err, ErrInvalidTopic) || !strings.Contains(err.Error(), "bad/name") {
		t.Fatalf("EnsureTopics: %v, want the invalid name refused", err)
	}
	dirs, meta := counter.counts()
	if meta-meta0 != 1 {
		t.Fatalf("meta.json written %d times for 40 topics", meta-meta0)
	}
	// Per topic the topic directory; then DIR/topics and DIR (meta.json)
	// once. The partition directories are fsynced once they hold data
	// that must stay (TestPartitionDirFsyncedBeforeItsDataIsRelied on).
	if got, want := dirs-dirs0, 40+2; got != want {
		t.Fatalf("%d directory fsyncs, want %d", got, want)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	r := openTest(t, dir, nil)
	for _, name := range names[:40] {
		info, err := r.Topic(name)
		if err != nil || len(info.Partitions) != 3 {
			t.Fatalf("after reopening, %s: %+v %v", name, info, err)
		}
		mustAppend(t, r, name, 2, EncodeBatch(-1, -1, -1, recs(name, 1)))
	}
	if n := len(values(t, r, "old", 0)); n != 2 {
		t.Fatalf("the existing topic holds %d records", n)
	}
	if _, err := os.Stat(partitionDir(dir, "bad", 0)); err == nil {
		t.Fatal("a directory was created for the invalid name")
	}
}

// A new partition's directory is not fsynced when it is created, but
// before anything relies on its active segment's entry being durable: the
// checkpoint that lets the journal go, and Close of a partition with data
// (an empty one lost in a crash is created again).
func TestPartitionDirFsyncedBeforeItsDataIsRelied(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	counter := &syncCountFS{FS: OSFS{}}
	b := openTest(t, dir, func(o *Options) { o.FS = counter })
	if err := b.EnsureTopics([]string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	a0, b0 := partitionDir(dir, "a", 0), partitionDir(dir, "b", 0)
	if counter.dirSyncsOf(a0)+counter.dirSyncsOf(b0) != 0 {
		t.Fatal("partition directories fsynced at creation")
	}
	mustAppend(t, b, "a", 0, EncodeBatch(-1, -1, -1, recs("x", 2)))
	if err := b.partitionFor("a", 0).syncSegment(); err != nil {
		t.Fatal(err)
	}
	if n := counter.dirSyncsOf(a0); n != 1 {
		t.Fatalf("the checkpoint fsynced a's directory %d times, want 1", n)
	}
	if err := b.partitionFor("a", 0).syncSegment(); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, b, "b", 0, EncodeBatch(-1, -1, -1, recs("y", 2)))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if na, nb := counter.dirSyncsOf(a0), counter.dirSyncsOf(b0); na != 1 || nb != 1 {
		t.Fatalf("directory fsyncs: a %d (want 1: once is enough), b %d (want 1, at Close)", na, nb)
	}
	// Opened again and closed with nothing appended: a's recovery point is
	// at its end, and was written after its directory and segment were
	// fsynced, so nothing is fsynced again.
	counter2 := &syncCountFS{FS: OSFS{}}
	r := openTest(t, dir, func(o *Options) { o.FS = counter2 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if na := counter2.dirSyncsOf(a0); na != 0 {
		t.Fatalf("after an idle reopen, a's directory fsynced %d times, want 0", na)
	}
	// Without a recovery point at the end, the entries may have been
	// written by a process killed before fsyncing them: the first
	// checkpoint or Close of a partition with data fsyncs its directory
	// again.
	if err := os.Remove(segmentName(a0, 0, recoverySuffix)); err != nil {
		t.Fatal(err)
	}
	counter3 := &syncCountFS{FS: OSFS{}}
	r = openTest(t, dir, func(o *Options) { o.FS = counter3 })
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if na := counter3.dirSyncsOf(a0); na != 1 {
		t.Fatalf("after reopening without a recovery point, a's directory fsynced %d times, want 1", na)
	}
}
