package broker

import (
	"fmt"
	"log/slog"
	"time"
)

// SyncPolicy says when appended data is fsynced.
type SyncPolicy int

const (
	// SyncBeforeAck fsyncs before Append returns (the default). Concurrent
	// appends to a partition share fsyncs.
	SyncBeforeAck SyncPolicy = iota
	// SyncIntervalUnsafe acknowledges after the write and fsyncs every
	// Options.SyncInterval: a machine crash can lose acknowledged records.
	SyncIntervalUnsafe
)

// Options configure a Broker. Dir is required; zero fields take defaults.
type Options struct {
	// Dir holds all broker data; one Broker owns it at a time (flock).
	Dir string
	// Sync is the durability policy (default SyncBeforeAck).
	Sync SyncPolicy
	// SyncInterval is the fsync period under SyncIntervalUnsafe (default 1s).
	SyncInterval time.Duration
	// DefaultPartitions is the partition count of topics created without
	// one, including auto-created topics (default 1).
	DefaultPartitions int32
	// DefaultTopicConfig fills unset fields of every created topic.
	DefaultTopicConfig TopicConfig
	// AutoCreateTopics makes Append create unknown topics
	// with the defaults instead of failing with ErrUnknownTopicOrPartition
	// (a listener answering Metadata calls EnsureTopic itself).
	AutoCreateTopics bool
	// JanitorInterval is how often retention and compaction run (default
	// 5 minutes; negative disables the background janitor).
	JanitorInterval time.Duration
	// IndexIntervalBytes is the log bytes between sparse index entries
	// (default 4096).
	IndexIntervalBytes int
	// MaxOpenSegmentReaders bounds open handles of inactive segments per
	// partition (default 2).
	MaxOpenSegmentReaders int
	// MaxOpenFiles bounds the descriptors held open, across the broker,
	// for segment files opened for appending (each partition's active
	// segment); past it the least recently used idle one is fsynced and
	// closed, and reopened when next used (fdcache.go). 0 holds one per
	// partition, so open files grow with the partition count. Inactive
	// segments' read handles are bounded per partition apart
	// (MaxOpenSegmentReaders).
	MaxOpenFiles int
	// WriteBackBytes bounds, under SyncBeforeAck, the memory of the
	// buffers that hold what was appended to active segments and not yet
	// written to them, across the broker (writeback.go; their capacity
	// counts): the journal makes an append durable, and its segment's copy
	// is written in larger pieces later (default 32 MiB; negative writes
	// each batch to its segment at once).
	WriteBackBytes int64
	// CompactionMapBytes bounds the memory of compaction's key map, about
	// 27 bytes per distinct key (default 128 MiB, about 5 million keys);
	// a partition with more keys is compacted in several passes over its
	// log, as Kafka's log.cleaner.dedupe.buffer.size does.
	CompactionMapBytes int64
	// OffsetsCompactBytes rewrites the group offsets file when it grows past
	// this size and is mostly superseded entries (default 16 MiB).
	OffsetsCompactBytes int64
	// FS is the file system (default OSFS); tests inject faults through it.
	FS FS
	// Now is the clock (default time.Now); retention and tombstone expiry
	// use it.
	Now func() time.Time
	// Logger receives recovery and janitor events (default slog.Default()).
	Logger *slog.Logger
	// ReopenInterval is how often a broker whose storage failed (Health)
	// tries to reopen itself from disk (default 10s; negative disables, so
	// only Reopen does).
	ReopenInterval time.Duration
	// ScrubBytesPerSecond bounds the background check that reads every
	// segment and verifies its batches' CRCs, pass after pass (default
	// 8 MiB/s; negative disables it).
	ScrubBytesPerSecond int64
	// ScrubPause is the rest after the open and between two passes of
	// the check (default 1 minute).
	ScrubPause time.Duration
	// AllowLostPartitions opens a topic whose partition directory vanished
	// by recreating it empty and reporting the loss (PartitionInfo.Lost);
	// without it Open fails with ErrPartitionLost.
	AllowLostPartitions bool
	// MaxTxnTimeout is the largest transaction.timeout.ms a transactional
	// producer may ask for (Kafka's transaction.max.timeout.ms, default
	// 15 minutes).
	MaxTxnTimeout time.Duration
	// TxnCheckInterval is how often transactions past their timeout are
	// aborted (default 1s).
	TxnCheckInterval time.Duration
}

func (o Options) withDefaults() Options {
	if o.SyncInterval <= 0 {
		o.SyncInterval = time.Second
	}
	if o.DefaultPartitions <= 0 {
		o.DefaultPartitions = 1
	}
	if o.JanitorInterval == 0 {
		o.JanitorInterval = 5 * time.Minute
	}
	if o.IndexIntervalBytes <= 0 {
		o.IndexIntervalBytes = 4096
	}
	if o.MaxOpenSegmentReaders <= 0 {
		o.MaxOpenSegmentReaders = 2
	}
	if o.OffsetsCompactBytes <= 0 {
		o.OffsetsCompactBytes = 16 << 20
	}
	if o.CompactionMapBytes <= 0 {
		o.CompactionMapBytes = 128 << 20
	}
	if o.FS == nil {
		o.FS = OSFS{}
	}
	if o.MaxOpenFiles > 0 {
		o.FS = newPooledFS(o.FS, o.MaxOpenFiles)
	}
	if o.WriteBackBytes == 0 {
		o.WriteBackBytes = defaultWriteBackBytes
	}
	if o.Sync == SyncBeforeAck && o.WriteBackBytes > 0 {
		o.FS = newWriteBackFS(o.FS, o.WriteBackBytes)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReopenInterval == 0 {
		o.ReopenInterval = 10 * time.Second
	}
	if o.ScrubBytesPerSecond == 0 {
		o.ScrubBytesPerSecond = 8 << 20
	}
	if o.ScrubPause <= 0 {
		o.ScrubPause = time.Minute
	}
	if o.MaxTxnTimeout <= 0 {
		o.MaxTxnTimeout = 15 * time.Minute
	}
	if o.TxnCheckInterval <= 0 {
		o.TxnCheckInterval = time.Second
	}
	return o
}

// Validate reports unusable options.
func (o Options) Validate() error {
	if o.Dir == "" {
		return fmt.Errorf("%w: data dir is required", ErrInvalidConfig)
	}
	if o.Sync != SyncBeforeAck && o.Sync != SyncIntervalUnsafe {
		return fmt.Errorf("%w: sync policy %d", ErrInvalidConfig, o.Sync)
	}
	return nil
}
