package broker

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowFS is the operating system's file system whose file fsyncs take
// delay longer while it is set: a slow disk.
type slowFS struct {
	OSFS
	delay atomic.Int64
}

func (f *slowFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &slowFile{File: file, fs: f}, nil
}

type slowFile struct {
	File
	fs *slowFS
}

func (f *slowFile) Sync() error {
	time.Sleep(time.Duration(f.fs.delay.Load())) // deliberate: the slow disk this FS models
	return f.File.Sync()
}

// lockedBuf is a log destination tests read while the broker writes.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func fsyncOf(b *Broker, file string) FsyncHistogram {
	for _, h := range b.FsyncStats() {
		if h.File == file {
			return h
		}
	}
	return FsyncHistogram{}
}

// TestFsyncHistograms: appends acknowledged under SyncBeforeAck are timed
// as journal fsyncs, new topic directories as directory fsyncs, and at
// Close the segments' fsyncs as segment fsyncs and their recovery points
// as checkpoint fsyncs; the buckets are cumulative and within the count.
// Two fsyncs slower than SlowFsync in a row give one warning naming the
// journal (rate-limited), and they land above the one-second bucket.
func TestFsyncHistograms(t *testing.T) {
	t.Parallel()
	fsys := &slowFS{}
	var logs lockedBuf
	b := openWithTopic(t, t.TempDir(), func(o *Options) {
		o.FS = fsys
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}, "f", TopicConfig{Partitions: 2})
	for i := range 5 {
		mustAppend(t, b, "f", int32(i%2), EncodeBatch(-1, -1, -1, recs(fmt.Sprintf("b%d", i), 2)))
	}
	if strings.Contains(logs.String(), "slow fsync") {
		t.Fatalf("a slow-fsync warning from a fast disk:\n%s", logs.String())
	}

	before := fsyncOf(b, FsyncJournal)
	fsys.delay.Store(int64(SlowFsync + 50*time.Millisecond))
	mustAppend(t, b, "f", 0, EncodeBatch(-1, -1, -1, recs("slow1", 1)))
	mustAppend(t, b, "f", 0, EncodeBatch(-1, -1, -1, recs("slow2", 1)))
	fsys.delay.Store(0)
	after := fsyncOf(b, FsyncJournal)
	oneSecond := 10 // FsyncBuckets[10] is 1.024s
	if slow := (after.Count - after.Buckets[oneSecond]) - (before.Count - before.Buckets[oneSecond]); slow < 2 {
		t.Errorf("%d journal fsyncs above %vs, want the 2 slow ones (before %+v, after %+v)", slow, FsyncBuckets[oneSecond], before, after)
	}
	if n := strings.Count(logs.String(), "slow fsync"); n != 1 {
		t.Errorf("%d slow-fsync warnings, want 1 (rate-limited):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "file=journal") {
		t.Errorf("the warning does not name the journal:\n%s", logs.String())
	}

	// Closing fsyncs the segments and writes their recovery points.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, file := range FsyncFiles {
		h := fsyncOf(b, file)
		if h.Count == 0 || h.Sum <= 0 {
			t.Errorf("%s: %d fsyncs timed (%v), want some", file, h.Count, h.Sum)
		}
		if len(h.Buckets) != len(FsyncBuckets) || h.Buckets[len(h.Buckets)-1] > h.Count {
			t.Errorf("%s: buckets %v, count %d", file, h.Buckets, h.Count)
		}
		for i := 1; i < len(h.Buckets); i++ {
			if h.Buckets[i] < h.Buckets[i-1] {
				t.Errorf("%s: buckets not cumulative: %v", file, h.Buckets)
			}
		}
	}
}
