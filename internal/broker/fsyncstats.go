package broker

import (
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The storage's fsync latency, by the kind of file fsynced, for the
// relay_broker_fsync_duration_seconds histogram, and a warning when one
// fsync takes SlowFsync or longer (etcd's WAL warns at the same second).
// Timing an fsync changes nothing of what it does or of how its failure is
// handled (health.go).

// SlowFsync is the duration from which an fsync is logged as slow: at
// most one warning per slowFsyncLogEvery, which counts the slow fsyncs
// since the last one.
const SlowFsync = time.Second

const slowFsyncLogEvery = 10 * time.Second

// Fsync file kinds: the "file" label of the histogram.
const (
	FsyncJournal    = "journal"    // the write-ahead journal and its directory
	FsyncSegment    = "segment"    // partition log segments
	FsyncCheckpoint = "checkpoint" // segments' recovery points, committed offsets, transaction state
	FsyncDirectory  = "directory"  // partition, topic and data directories (new and removed files)
)

// FsyncFiles are the file kinds, in the order of FsyncStats.
var FsyncFiles = []string{FsyncJournal, FsyncSegment, FsyncCheckpoint, FsyncDirectory}

// FsyncBuckets are the histogram's upper bounds in seconds: 1ms doubling
// to 8.192s, etcd's buckets for its WAL fsync histogram.
var FsyncBuckets = func() []float64 {
	b := make([]float64, 14)
	for i := range b {
		b[i] = 0.001 * math.Pow(2, float64(i))
	}
	return b
}()

// FsyncHistogram is the fsync latency of one kind of file since the
// broker opened.
type FsyncHistogram struct {
	File string
	// Buckets are cumulative counts, one per FsyncBuckets bound.
	Buckets []uint64
	Count   uint64
	Sum     time.Duration
}

type fsyncHist struct {
	buckets [14]atomic.Uint64 // non-cumulative
	count   atomic.Uint64
	sumNs   atomic.Int64
}

// fsyncStats are a broker's fsync histograms, kept across reopens.
type fsyncStats struct {
	hist [4]fsyncHist

	mu       sync.Mutex
	lastWarn time.Time
	slow     int // slow fsyncs not yet reported
}

// fsyncFile classifies a health operation ("fsync journal", "fsync
// partition dir", ...) by its file kind.
func fsyncFile(op string) int {
	switch {
	case strings.HasSuffix(op, " dir"):
		if strings.Contains(op, "journal") {
			return 0
		}
		return 3
	case strings.Contains(op, "journal"):
		return 0
	case strings.Contains(op, "segment"), op == "fsync on close":
		return 1
	}
	return 2
}

// observe records one fsync of kind file that took d, warning when slow.
func (s *fsyncStats) observe(file int, d time.Duration, what string, log *slog.Logger) {
	if s == nil {
		return
	}
	h := &s.hist[file]
	secs := d.Seconds()
	for i, ub := range FsyncBuckets {
		if secs <= ub {
			h.buckets[i].Add(1)
			break
		}
	}
	h.count.Add(1)
	h.sumNs.Add(int64(d))
	if d < SlowFsync {
		return
	}
	s.mu.Lock()
	s.slow++
	now := time.Now()
	if now.Sub(s.lastWarn) < slowFsyncLogEvery {
		s.mu.Unlock()
		return
	}
	n := s.slow
	s.slow, s.lastWarn = 0, now
	s.mu.Unlock()
	log.Warn("slow fsync: the disk is slow to make writes durable, and acknowledgements wait for it",
		"file", FsyncFiles[file], "op", what, "took", d.Round(time.Millisecond), "slow_fsyncs", n, "threshold", SlowFsync)
}

// snapshot returns the histograms in FsyncFiles order.
func (s *fsyncStats) snapshot() []FsyncHistogram {
	out := make([]FsyncHistogram, len(FsyncFiles))
	for f := range FsyncFiles {
		h := &s.hist[f]
		fh := FsyncHistogram{File: FsyncFiles[f], Buckets: make([]uint64, len(FsyncBuckets)), Count: h.count.Load(), Sum: time.Duration(h.sumNs.Load())}
		var cum uint64
		for i := range FsyncBuckets {
			cum += h.buckets[i].Load()
			fh.Buckets[i] = cum
		}
		fh.Count = max(fh.Count, cum)
		out[f] = fh
	}
	return out
}

// FsyncStats returns the fsync latency histograms since the broker opened,
// one per kind of file (FsyncFiles).
func (b *Broker) FsyncStats() []FsyncHistogram { return b.fsync.snapshot() }
