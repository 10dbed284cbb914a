package broker

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// countingFS records which partition directories an open lists and how
// often it reads a recovery file.
type countingFS struct {
	OSFS
	root string

	mu            sync.Mutex
	listed        []string // partition directories, relative to root/topics
	recoveryReads int
}

func (c *countingFS) ReadDir(name string) ([]os.DirEntry, error) {
	if rel, err := filepath.Rel(filepath.Join(c.root, "topics"), name); err == nil && !strings.HasPrefix(rel, "..") && strings.Count(rel, string(filepath.Separator)) == 1 {
		c.mu.Lock()
		c.listed = append(c.listed, rel)
		c.mu.Unlock()
	}
	return c.OSFS.ReadDir(name)
}

func (c *countingFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if strings.HasSuffix(name, recoverySuffix) && flag == os.O_RDONLY {
		c.mu.Lock()
		c.recoveryReads++
		c.mu.Unlock()
	}
	return c.OSFS.OpenFile(name, flag, perm)
}

// openCounting opens the broker in dir and returns what its open listed
// and read: the counts are taken as Open returns.
func openCounting(t *testing.T, dir string, mod func(*Options)) (*Broker, []string, int) {
	t.Helper()
	c := &countingFS{root: dir}
	b := openTest(t, dir, func(o *Options) {
		o.FS = c
		if mod != nil {
			mod(o)
		}
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	listed := slices.Clone(c.listed)
	slices.Sort(listed)
	return b, listed, c.recoveryReads
}

func wantNoManifest(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, cleanCloseFile)); !os.IsNotExist(err) {
		t.Fatalf("the manifest outlived the open: %v", err)
	}
}

func closeBroker(t *testing.T, b *Broker) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}

// An open after a clean close lists no partition directory and reads no
// recovery file, but one whose directory changed since is listed as
// without a manifest (its leftovers cleaned up), and nothing is lost.
func TestCleanCloseManifestSkipsListing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "c", TopicConfig{Partitions: 4})
	for p := range int32(4) {
		mustAppend(t, b, "c", p, EncodeBatch(-1, -1, -1, recs("a", 3)))
		mustAppend(t, b, "c", p, EncodeBatch(-1, -1, -1, recs("b", 3)))
	}
	closeBroker(t, b)
	if _, err := os.Stat(filepath.Join(dir, cleanCloseFile)); err != nil {
		t.Fatalf("no manifest after a clean close: %v", err)
	}

	b, listed, reads := openCounting(t, dir, nil)
	if len(listed) != 0 || reads != 0 {
		t.Fatalf("the open listed %v and read %d recovery files", listed, reads)
	}
	wantNoManifest(t, dir)
	for p := range int32(4) {
		if got := readAll(t, b, "c", p); len(got) != 6 {
			t.Fatalf("partition %d holds %d records after the open, want 6", p, len(got))
		}
		if res := mustAppend(t, b, "c", p, EncodeBatch(-1, -1, -1, recs("c", 1))); res.BaseOffset != 6 {
			t.Fatalf("partition %d appended at %d, want 6", p, res.BaseOffset)
		}
	}
	closeBroker(t, b)

	// The operator leaves a stray temporary file in partition 1 and
	// removes partition 2's recovery point.
	stray := filepath.Join(partitionDir(dir, "c", 1), "x.tmp")
	if err := os.WriteFile(stray, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	rps, _ := filepath.Glob(filepath.Join(partitionDir(dir, "c", 2), "*"+recoverySuffix))
	if len(rps) != 1 {
		t.Fatalf("partition 2 has recovery files %v", rps)
	}
	if err := os.Remove(rps[0]); err != nil {
		t.Fatal(err)
	}
	b, listed, _ = openCounting(t, dir, nil)
	if want := []string{filepath.Join("c", "1"), filepath.Join("c", "2")}; !slices.Equal(listed, want) {
		t.Fatalf("the open listed %v, want %v", listed, want)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("the stray file was not cleaned up: %v", err)
	}
	wantRecords(t, b, "c", 4, 7)
}

// wantRecords checks that each of a topic's first parts partitions holds
// n records.
func wantRecords(t *testing.T, b *Broker, topic string, parts int32, n int) {
	t.Helper()
	for p := range parts {
		if got := readAll(t, b, topic, p); len(got) != n {
			t.Fatalf("%s/%d holds %d records, want %d", topic, p, len(got), n)
		}
	}
}

// A damaged, cut or foreign manifest is ignored with a warning and
// removed; every partition is listed and nothing is lost.
func TestCleanCloseManifestDamaged(t *testing.T) {
	t.Parallel()
	other := t.TempDir()
	closeBroker(t, openWithTopic(t, other, nil, "c", TopicConfig{Partitions: 2}))
	foreign, err := os.ReadFile(filepath.Join(other, cleanCloseFile))
	if err != nil {
		t.Fatal(err)
	}
	for name, tamper := range map[string]func([]byte) []byte{
		"flipped byte": func(b []byte) []byte { b[len(b)-3] ^= 0x10; return b },
		"cut short":    func(b []byte) []byte { return b[:len(b)/2] },
		"empty":        func([]byte) []byte { return nil },
		"other log":    func([]byte) []byte { return foreign },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			b := openWithTopic(t, dir, nil, "c", TopicConfig{Partitions: 2})
			for p := range int32(2) {
				mustAppend(t, b, "c", p, EncodeBatch(-1, -1, -1, recs("a", 3)))
			}
			closeBroker(t, b)
			path := filepath.Join(dir, cleanCloseFile)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tamper(data), 0o644); err != nil {
				t.Fatal(err)
			}
			logger, logs := captureLogs()
			b, listed, _ := openCounting(t, dir, func(o *Options) { o.Logger = logger })
			if len(listed) != 2 {
				t.Fatalf("the open listed %v, want both partitions", listed)
			}
			if len(logs.lines(t, "ignoring the clean-close manifest; every partition is listed")) != 1 {
				t.Fatalf("no warning about the manifest")
			}
			wantNoManifest(t, dir)
			wantRecords(t, b, "c", 2, 3)
		})
	}
}

// Edits made while the broker is stopped, in a partition directory or in
// a segment file in place, give the open with a manifest the same result
// as the open without one.
func TestCleanCloseManifestOperatorEdits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "e", TopicConfig{Partitions: 4, SegmentBytes: 2048, RetentionMs: -1})
	for i := range 12 {
		for p := range int32(4) {
			mustAppend(t, b, "e", p, EncodeBatch(-1, -1, -1, recs(strings.Repeat("v", 40+i), 5)))
		}
	}
	closeBroker(t, b)
	segs := func(p int32) []string {
		m, _ := filepath.Glob(filepath.Join(partitionDir(dir, "e", p), "*"+logSuffix))
		slices.Sort(m)
		if len(m) < 3 {
			t.Fatalf("partition %d has segments %v, want at least 3", p, m)
		}
		return m
	}
	// Partition 0: its oldest segment removed. Partition 1: its active
	// segment cut short by 10 bytes. Partition 2: a byte of the active
	// segment's last batch flipped. Partition 3: untouched.
	if err := os.Remove(segs(0)[0]); err != nil {
		t.Fatal(err)
	}
	active := segs(1)[len(segs(1))-1]
	fi, err := os.Stat(active)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(active, fi.Size()-10); err != nil {
		t.Fatal(err)
	}
	active = segs(2)[len(segs(2))-1]
	data, err := os.ReadFile(active)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-5] ^= 0x40
	if err := os.WriteFile(active, data, 0o644); err != nil {
		t.Fatal(err)
	}

	twin := t.TempDir()
	if err := os.CopyFS(twin, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(twin, cleanCloseFile)); err != nil {
		t.Fatal(err)
	}
	with, listed, _ := openCounting(t, dir, func(o *Options) { o.AllowLostPartitions = true })
	if want := []string{filepath.Join("e", "0")}; !slices.Equal(listed, want) {
		t.Fatalf("the open listed %v, want %v", listed, want)
	}
	without := openTest(t, twin, func(o *Options) { o.AllowLostPartitions = true })
	a, err := with.Topic("e")
	if err != nil {
		t.Fatal(err)
	}
	z, err := without.Topic("e")
	if err != nil {
		t.Fatal(err)
	}
	for p := range int32(4) {
		pa, pz := a.Partitions[p], z.Partitions[p]
		pa.AppendedBytes, pz.AppendedBytes = 0, 0
		for i := range pa.Lost {
			pa.Lost[i].Detected = time.Time{}
		}
		for i := range pz.Lost {
			pz.Lost[i].Detected = time.Time{}
		}
		if !reflect.DeepEqual(pa, pz) {
			t.Errorf("partition %d with the manifest %+v, without %+v", p, pa, pz)
		}
		if len(pa.Lost) > 0 {
			continue // a fetch there fails, as it should
		}
		if ra, rz := readAll(t, with, "e", p), readAll(t, without, "e", p); !reflect.DeepEqual(ra, rz) {
			t.Errorf("partition %d reads %d records with the manifest, %d without", p, len(ra), len(rz))
		}
	}
	if a.Partitions[1].LogEndOffset >= a.Partitions[3].LogEndOffset || len(a.Partitions[2].Lost) == 0 {
		t.Fatalf("the edits were not seen: %+v", a.Partitions)
	}
}

// The manifest is written only by a clean close of a healthy broker: not
// after a failed fsync.
func TestCleanCloseManifestOnlyAfterCleanClose(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval = ffs, -1 }, "f", TopicConfig{Partitions: 2})
	ffs.inject(faultRule{op: opSync, suffix: journalSuffix, times: 1})
	if _, err := b.Append(context.Background(), "f", 1, EncodeBatch(-1, -1, -1, recs("b", 3))); err == nil || b.Health() == nil {
		t.Fatalf("the append after a failed fsync: %v, health %v", err, b.Health())
	}
	_ = b.Close()
	wantNoManifest(t, dir)
}

// A full disk while Close writes the manifest costs the next open only
// its speed: no manifest, no leftover, the close itself succeeds.
func TestCleanCloseManifestDiskFull(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ffs := newInjectFS()
	b := openWithTopic(t, dir, func(o *Options) { o.FS, o.ReopenInterval = ffs, -1 }, "f", TopicConfig{Partitions: 2})
	mustAppend(t, b, "f", 0, EncodeBatch(-1, -1, -1, recs("a", 3)))
	rule := ffs.inject(faultRule{op: opWrite, suffix: cleanCloseFile + ".tmp", times: 1, err: syscall.ENOSPC})
	if err := b.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if rule.fired != 1 {
		t.Fatalf("the fault fired %d times", rule.fired)
	}
	wantNoManifest(t, dir)
	if _, err := os.Stat(filepath.Join(dir, cleanCloseFile+".tmp")); !os.IsNotExist(err) {
		t.Fatalf("a temporary manifest was left: %v", err)
	}
	r, listed, _ := openCounting(t, dir, nil)
	if len(listed) != 2 {
		t.Fatalf("the open listed %v, want both partitions", listed)
	}
	wantRecords(t, r, "f", 1, 3)
}
