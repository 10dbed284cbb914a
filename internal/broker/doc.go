// Package broker is Relay's embedded broker storage engine: topics of
// partitioned, durable logs holding Kafka record batches v2 verbatim, with
// Kafka's idempotent producer semantics, retention, compaction and durable
// consumer group offsets. The Kafka wire-protocol listener and the relay's
// sink are built on its Go API (Open, CreateTopic, Append, Fetch, Wait,
// InitProducerID, ProducerState, CommitOffsets, ...); KafkaErrorCode maps its
// errors to protocol error codes.
//
// # Directory layout
//
//	DIR/LOCK                     flock held by the open Broker
//	DIR/meta.json                topics and configs, producer id allocation
//	DIR/groups/offsets.log       committed consumer group offsets
//	DIR/journal/NNN.journal      write-ahead journal (SyncBeforeAck)
//	DIR/topics/T/P/              one directory per partition P of topic T
//	    00000000000000000000.log        segment: record batches
//	    00000000000000000000.index      sparse offset index
//	    00000000000000000000.timeindex  sparse time index
//	    00000000000000001234.snapshot   producer state as of offset 1234
//	    00000000000000001234.log.cut-N  bytes cut from a corrupt tail
//
// File names carry the 20-digit, zero-padded base offset: the offset of the
// first record the segment may hold (for a snapshot, the offset it is valid
// at). meta.json is replaced atomically (write a temp file, fsync, rename,
// fsync the directory); so are snapshots and rewritten offsets files.
//
// # Segments (.log)
//
// A segment is a concatenation of record batches v2 exactly as producers
// sent them, except that the broker overwrote the 8-byte baseOffset (which
// sits outside the CRC) with the assigned offset:
//
//	baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 |
//	magic int8 (=2) | crc uint32 (CRC32C of attributes..end) |
//	attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 |
//	maxTimestamp int64 | producerId int64 | producerEpoch int16 |
//	baseSequence int32 | recordsCount int32 | records (maybe compressed)
//
// All integers are big-endian. A batch occupies batchLength+12 bytes.
// Offsets increase strictly from batch to batch; compaction may leave gaps
// inside and between batches but never reorders or renumbers. Fetches serve
// these bytes without re-encoding. The last segment is active (appended to);
// it rolls when it would exceed segment.bytes (at most 2 GiB, since index
// positions are 32-bit) or is older than segment.ms. Before a new segment
// is created the old one is fsynced and its index files are written and
// fsynced, so only the active segment can ever have a torn tail.
//
// # Indexes (.index, .timeindex)
//
// The offset index holds 8-byte entries, uint32 offset relative to the
// segment base then uint32 file position of the batch starting there, one
// entry for the first batch and then at most one per index-interval bytes
// (4 KiB by default). The time index holds 12-byte entries, int64 maximum
// timestamp seen so far (unix ms) then uint32 relative offset of the batch
// where that maximum was reached, written with the offset index entries when
// the maximum grew. Both are strictly increasing. They are written only for
// inactive segments; the active segment's index lives in memory and is
// rebuilt from the log on open. An inactive segment's indexes are loaded on
// demand and dropped again when its file handle is evicted (at most
// MaxOpenSegmentReaders per partition), so memory does not grow with the
// log. Indexes that are missing, of a length that is not a whole number of
// entries, non-monotonic, or pointing past the log are rebuilt on open.
//
// # Recovery
//
// On open every batch of each partition's active segment is read and its
// CRC checked, and offsets must increase. The first batch that fails (a torn
// write, flipped bits, a zero-filled tail after a power loss) and everything
// after it is copied to NNN.log.cut-<unix nanos> and truncated off, then the
// file is fsynced. Under fsync-before-ack no acknowledged batch can be in
// the cut part: an append is acknowledged only after the fsync that covered
// it, and the high watermark (what consumers can read) follows the fsyncs.
// Under SyncBeforeAck the fsync that acknowledged a batch may have been the
// journal's, not the segment's: the journal is then replayed into the
// partitions (see Durability), restoring whatever a power loss took from
// the active segments.
//
// # Producer state (.snapshot)
//
// Each partition keeps, per producer id, the current epoch and the last five
// batches (first and last sequence, first and last offset, max timestamp)
// for duplicate detection. A snapshot is written when a segment rolls and on
// clean close; on open the newest snapshot at or below the log end is loaded
// and the batch headers after its offset are replayed (with no usable
// snapshot, the whole log is replayed). Format, big-endian:
//
//	"RLPS" | uint16 version (1) | int64 offset | uint32 producer count |
//	per producer: int64 id | int16 epoch | uint8 n |
//	    n × (int32 firstSeq | int32 lastSeq | int64 firstOffset |
//	         int64 lastOffset | int64 maxTimestamp)
//	| uint32 CRC32C of everything before
//
// The newest two snapshots are kept. Compaction keeps every producer's last
// batch (emptied of records if need be) so replaying the log still restores
// the state.
//
// # Durability and group commit
//
// With SyncBeforeAck (the default) Append writes the batch to its segment
// and, in the same order, to the broker-wide journal, under the partition
// lock, then waits for a journal fsync that covers it. One journal fsync
// runs at a time and covers every append written before it started, to any
// partition: concurrent appenders share fsyncs, and a producer writing to
// eight partitions pays one fsync, not eight. Segments are fsynced in a
// checkpoint each time the journal file passes 64 MiB, after which the
// journal files it covers are deleted; a segment is also fsynced when it
// rolls and on close. A clean Close removes the journal. On open the
// journal is replayed: a batch whose offsets the partition holds is
// skipped, one that continues the log is appended, and the restored
// partitions are fsynced before the replayed files are deleted.
//
// Journal files start with "RJNL", uint32 version (1) and int64 bound: the
// number of valid bytes of the previous journal file (-1: all). Records
// follow: uint32 length | uint32 CRC32C of the rest | uint16 topic length |
// topic | int32 partition | the batch as stored. A file ends at its first
// short or damaged record.
//
// A failed write is truncated away before the error returns. A failed fsync
// rolls the partitions concerned back to their last durable position (the
// kernel may have dropped the dirty pages), fsyncs the truncation, rebuilds
// producer state from disk, and fails every append not yet covered; appends
// resume once the disk works again, in a new journal file whose bound
// excludes the records that were rolled back. AppendAsync splits Append into
// the write and a wait for the covering fsync, so a caller (the protocol
// server, per connection; the relay's sink, per batch) can write its next
// batch while the previous one is being fsynced; its result may be
// acknowledged only once the wait returned nil. SyncIntervalUnsafe
// acknowledges after the write and fsyncs each partition on an interval,
// without a journal: a crash can lose acknowledged data.
//
// # Consumer group offsets (groups/offsets.log)
//
// An append-only file of frames: uint32 payload length | uint32 CRC32C of
// payload | payload, where the payload is uint16 group length, group, uint16
// topic length, topic, int32 partition, int64 offset, int32 leader epoch,
// int64 commit time (unix ms), uint32 metadata length, metadata. The last
// frame for a (group, topic, partition) wins. Each CommitOffsets call writes
// its frames and fsyncs once. A torn tail is cut aside like a segment's. The
// file is rewritten atomically with only live entries once it passes
// OffsetsCompactBytes and is at least half superseded frames.
//
// # Retention and compaction
//
// For cleanup.policy=delete, the janitor deletes whole inactive segments,
// oldest first, while the oldest one's newest timestamp is older than
// retention.ms or the partition without it would still hold retention.bytes;
// the log start offset becomes the first remaining segment's base. For
// cleanup.policy=compact, it keeps the newest record per key across the
// inactive segments (keys are tracked by a 128-bit hash), rewriting each
// changed segment to NNN.log.cleaned, fsyncing it, removing its index files,
// renaming it over the original, fsyncing the directory and writing fresh
// indexes; a crash anywhere in between leaves either segment whole and any
// missing index is rebuilt. Rewritten batches keep their base offset, last
// offset delta, producer fields and timestamps. Tombstones (null values) go
// once their batch's max timestamp is older than delete.retention.ms.
package broker
