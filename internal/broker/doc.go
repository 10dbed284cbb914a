// Package broker is Relay's embedded broker storage engine: topics of
// partitioned, durable logs holding Kafka record batches v2 verbatim, with
// Kafka's idempotent producer semantics and transactions, retention,
// compaction and durable consumer group offsets. The Kafka wire-protocol listener and the relay's
// sink are built on its Go API (Open, CreateTopic, Append, Fetch, Wait,
// InitProducerID, ProducerState, CommitOffsets, ...); KafkaErrorCode maps its
// errors to protocol error codes.
//
// # Directory layout
//
//	DIR/LOCK                     flock held by the open Broker
//	DIR/meta.json                format version (format.go), topics and configs, producer id allocation
//	DIR/clean-close              what the last clean Close left, for the next open
//	DIR/groups/offsets.log       committed consumer group offsets
//	DIR/txns/state.log           transaction coordinator state
//	DIR/journal/NNN.journal      write-ahead journal (SyncBeforeAck)
//	DIR/deleted/                 deleted topics' directories, being removed
//	DIR/topics/T/P/              one directory per partition P of topic T
//	    00000000000000000000.log        segment: record batches
//	    00000000000000000000.index      sparse offset index
//	    00000000000000000000.timeindex  sparse time index
//	    00000000000000001234.snapshot   producer state as of offset 1234
//	    00000000000000001234.log.cut-N  bytes cut from a corrupt tail, or a
//	                                    damaged range rewritten from the journal
//	    00000000000000001234.recovery   recovery point of the active segment
//	    lost.json                       offset ranges found lost (see Lost data)
//	    log-start                       the log start DeleteRecords set, in decimal
//
// File names carry the 20-digit, zero-padded base offset: the offset of the
// first record the segment may hold (for a snapshot, the offset it is valid
// at). meta.json is replaced atomically (write a temp file, fsync, rename,
// fsync the directory); so are snapshots and rewritten offsets files. A new
// topic's partition directories are fsynced into their parents before
// meta.json lists it, so a directory missing later is lost data. A
// partition directory itself (the entry of the active segment an open or
// a creation made) is fsynced only before its data is relied on: by the
// journal checkpoint before it deletes journal files, on Close of a
// partition with data, by the interval fsync; an empty segment lost in a
// crash is created again. EnsureTopics creates many topics with one
// DIR/topics fsync and one meta.json write. A configuration change
// (AlterTopicConfig) takes effect in memory only after its meta.json
// write returned: a failed write or fsync leaves the old configuration in
// memory and on disk, and a failed directory fsync after the rename
// leaves the old one in memory and either on disk, never a torn file; a
// retry writes it again (TestAlterTopicConfigStorageFaults, with a crash
// copy at each failure).
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
// On open every batch of each partition's active segment after its
// recovery point (below) is read and its CRC checked, and offsets must
// increase. A damaged batch that good batches
// follow (its length field sound, the next batch's CRC good) is bit rot,
// not a torn write: it stays in place and the batches after it are kept. A
// damaged tail (a torn write, a zero-filled tail after a power loss) is
// copied to NNN.log.cut-<unix nanos> and truncated off, then the file is
// fsynced. Under fsync-before-ack no acknowledged batch is lost by the cut:
// an append is acknowledged only after the fsync that covered it, and the
// high watermark (what consumers can read) follows the fsyncs. Under
// SyncBeforeAck that fsync may have been the journal's, not the segment's:
// the journal is then replayed into the partitions (see Durability),
// rewriting the range it covers, which repairs damage there. Damage left
// unrepaired (in place, or a cut whole batch whose offsets the journal did
// not restore) is reported lost. Of an inactive segment, open checks the
// indexes (rebuilt when unsound), the batches from the last index entry on,
// and, unless the topic is compacted, that its offsets reach the next
// segment's base; the rest is left to reads and the background check.
//
// # Recovery point (.recovery)
//
// As Kafka's recovery-point-offset-checkpoint, a recovery point records how
// far the active segment is known durable and sound, so that an open scans
// only the bytes after it: without one, an open after a crash read and
// CRC-checked the whole active segment (up to 1 GiB per partition, 13.5 s
// for a 10 GiB log from a cold cache). The active segment's NNN.recovery
// (recoverypoint.go has the format) is an append-only list of CRC'd frames,
// one written and fsynced after each fsync of the segment by a journal
// checkpoint and on Close, each recording a state the fsync covered: the
// next offset and byte position, the last batch's position, base offset
// and CRC, the new in-memory index entries and the producer state there.
// The open takes the last sound frame, checks it (position within the
// file, index entries below it, and the batch ending at the position read
// whole, its CRC sound and its base offset, CRC and last offset the ones
// recorded), loads the index and producer state from it and scans from the
// position on as above; the journal replay rewrites only what follows it.
// The file is removed when its segment rolls and at the next open if
// left by a segment that is no longer active.
//
// Fault model of the recovery point, and the tests that show it
// (recoverypoint_test.go):
//   - Killed mid-write (of a segment, the journal or the recovery file): a
//     frame is written only after the segment fsync covering it, so the
//     bytes before the point are on disk; a torn or partly written frame
//     fails its CRC and the previous frame is used; bytes after the point
//     are scanned, a torn tail cut aside as before;
//     TestRecoveryPointLimitsTheScanAfterKill,
//     TestTornTailAfterRecoveryPointIsCut,
//     TestDamageAfterRecoveryPointRepairedFromJournal.
//   - Failed fsync: of the segment, the broker fails (see Durability) and
//     no frame is written, so the point never covers pages a failed fsync
//     may have dropped; of the recovery file, or a failed write of it (a
//     full disk), nothing fails: the point is an optimisation, the file is
//     rewritten whole the next time and the next open after a crash scans
//     more; TestRecoveryPointWriteFailureIsHarmless.
//   - Torn, damaged or missing recovery file, or one left beside a segment
//     it does not describe (the segment cut shorter, its last batch
//     replaced, an operator copying or deleting files): the check fails or
//     there is no point, and the whole active segment is scanned as without
//     one (an unusable file is logged and removed);
//     TestUnusableRecoveryPointMeansFullScan. A rollback after a failed
//     fsync that cuts the segment below the point does the same.
//   - Damage before the point (bit rot in bytes an fsync covered): trusted
//     by the open, as Kafka trusts what precedes its recovery point, so it
//     is no longer found on open nor repaired from the journal. Every read
//     and the background check verify each batch they touch, so it is
//     found there, reported lost with its exact offsets (a run of damaged
//     batches up to the good one after them) and never served;
//     TestDamageBeforeRecoveryPointFoundByReadsAndScrub,
//     TestDamageBeforeRecoveryPointAfterCleanStop. The last batch before
//     the point is always checked: TestDamagedTailAfterCleanStopIsReported.
//   - Under SyncIntervalUnsafe (no journal, no checkpoints) only Close
//     writes a point.
//   - A Close with nothing appended since the last frame (an open and
//     close of a partition that stayed idle, or one idle since a
//     checkpoint) fsyncs nothing and writes no frame: the frame was
//     written after an fsync that covered the whole segment, so a crash
//     right after finds what it found before; a broker of 8,000 idle
//     partitions otherwise made 24,000 fsyncs to close, and each restart
//     grew every recovery file by a frame; TestIdleCloseSyncsNothing.
//
// # Clean-close manifest (clean-close)
//
// A clean Close of a healthy broker writes DIR/clean-close: for each
// partition, what its directory held and its recovery file's bytes, with
// the directory's identity (device, inode, modification and change times).
// The next open takes it (reads it, removes it and fsyncs DIR) before any
// partition opens, and opens each partition whose directory still has that
// identity without listing the directory or reading the recovery file: at
// 8,000 small partitions those two reads were about half of the open. The
// recovery point is checked against the segment as always. A partition
// whose directory changed, one missing from the manifest, and every
// partition when the manifest is damaged or of another log, are opened as
// without it. cleanclose.go has the format and the fault model.
//
// # Lost data
//
// Every read verifies the CRC of each batch it serves. A batch that fails
// is never served, nor skipped as if the log ended there: the read stops
// before it, and a fetch of its offsets fails with ErrDataLost (the
// listener answers CORRUPT_MESSAGE). The background check (scrub.go,
// Options.ScrubBytesPerSecond, 8 MiB/s by default, Options.ScrubPause
// between passes) reads every segment the same way, so damage nobody reads
// is found too. Damage found on open, by a read or by the check, offsets
// missing from both a segment and the journal, and a partition directory
// that vanished are reported: an ERROR log "data lost" naming topic,
// partition and offsets; PartitionInfo.Lost and Broker.Lost; and the
// partition's lost.json (version 1, a list of {first, last, reason,
// detected, segment, pos, size}: the offsets, and where damaged bytes stay
// in place, which reads and scans hop over), written atomically, read on
// open and by Inspect, so the report survives restarts. Damaged bytes are
// never deleted; compaction skips a partition with lost ranges. Deleting
// lost.json while the broker is stopped forgets the report.
//
// A partition directory that vanished while meta.json lists its topic is
// lost data, not a new partition: Open fails with ErrPartitionLost naming
// it and recreates nothing, unless Options.AllowLostPartitions (relay:
// --allow-lost-partitions) is set, when it is recreated empty with a lost
// range of unknown extent (last -1) on record.
//
// # Producer state (.snapshot)
//
// Each partition keeps, per producer id, the current epoch and the last five
// batches (first and last sequence, first and last offset, max timestamp)
// for duplicate detection. A snapshot is written when a segment rolls, and
// each recovery point carries one (see Recovery point), so a clean close
// writes a snapshot file only when it could not write a recovery point; on
// open the newest snapshot at or below the log end is loaded (the recovery
// point's when newer) and the batch headers after its offset are replayed
// (with no usable snapshot, the whole log is replayed). Format, big-endian:
//
//	"RLPS" | uint16 version (2) | int64 offset | uint32 producer count |
//	per producer: int64 id | int16 epoch | uint8 n |
//	    n × (int32 firstSeq | int32 lastSeq | int64 firstOffset |
//	         int64 lastOffset | int64 maxTimestamp)
//	| per producer: int64 first offset of its open transaction (-1: none)
//	| uint32 aborted count | per aborted transaction: int64 producer id |
//	    int64 first offset | int64 marker offset
//	| uint32 CRC32C of everything before
//
// Version 1 snapshots (without the transaction part) are still read.
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
// checkpoint each time the journal file passes 64 MiB, or 32 KiB for each
// partition the file covers when that is more (up to 1 GiB, so that with
// thousands of partitions a checkpoint's three fsyncs per partition are
// paid for more than a few KiB of each), after which the journal files it
// covers are deleted; a segment is also fsynced when it rolls and on
// close. The segment's copy of a batch is held in memory first and written
// in larger pieces (write-back, writeback.go, with its fault model;
// Options.WriteBackBytes, buffers of 32 MiB across the broker by default),
// by a goroutine of its own while the buffers are below the bound: the
// journal already made the batch durable, and one write per batch and
// partition was most of an append's cost with thousands of partitions.
// The journal's records are likewise gathered in memory and written with
// one write in the sync that acknowledges them (journal.go, with its fault
// model: a failed write gives up every record since the last fsync, whose
// partitions roll back). A clean Close removes the journal. On open the
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
// Replay runs in two passes. The first finds, per partition, the first
// batch the journal holds for the active segment; when the journal holds
// an unbroken run from there, the segment is cut back to that batch (damaged
// bytes in the cut range are kept in a .cut file first) and the second pass
// appends the run again, so everything since the last checkpoint is
// rewritten and fsynced rather than trusted from the page cache. The second
// pass skips batches the log holds, appends those that continue it, and a
// batch beyond the log end is appended after the offsets in between are
// reported lost. A damaged journal record that good records follow is
// skipped with an ERROR log (its batch then shows as a gap if no segment
// holds it); one at the end is a torn write, never acknowledged.
//
// A failed segment write is truncated away before the error returns; the
// append fails, nothing else does. When that truncate fails too, the next
// append (or Close) cuts the torn bytes first and goes on after the
// batches before them, which their journal records cover; it never cuts
// back to the last fsync, which would give those batches' offsets to new
// ones while their journal records stayed, for a replay to bring back in
// place of acknowledged batches (TestTornWriteKeepsEarlierBatches). A
// failed journal write is the one case that does cut back to the last
// fsync: it rolls back every partition with records since, and the next
// journal file's bound keeps those records out of any replay
// (TestJournalWriteFaultGivesUpUnsyncedBatches).
//
// A failed fsync is sticky (health.go): the broker fails every append waiting for it and every later one, Wait and
// CommitOffsets too, with ErrStorageFailed wrapping the I/O error, and
// Health returns it, until the broker was reopened from disk (Reopen, or
// the automatic reopen every Options.ReopenInterval, 10s by default). The
// fsync is never retried: after a failed fsync Linux may have dropped the
// dirty pages and marked them clean, so a second fsync can succeed without
// them. No journal file is deleted while the broker is failed, and a
// checkpoint deletes journal files only after every segment they cover was
// fsynced. Reopening replays the journal as above, rewriting the covered
// range of each active segment, so the data is written anew and fsynced
// once the disk works. AppendAsync splits Append into
// the write and a wait for the covering fsync, so a caller (the protocol
// server, per connection; the relay's sink, per batch) can write its next
// batch while the previous one is being fsynced; its result may be
// acknowledged only once the wait returned nil. SyncIntervalUnsafe
// acknowledges after the write and fsyncs each partition on an interval,
// without a journal: a crash can lose acknowledged data; its interval
// fsync is sticky too, but with no journal a reopen keeps what the segment
// files hold.
//
// # Open files
//
// Each partition holds its active segment's file open for appending, so
// open files grow with the partition count unless Options.MaxOpenFiles
// bounds them (fdcache.go): the segment files opened for appending then
// share a broker-wide pool, and opening one past the bound closes the
// least recently used idle one, after fsyncing it when it was written
// since its last fsync; its next use reopens it. A file in use is never
// closed under its caller: the next least recently used idle one is
// closed instead, so the bound is exceeded only while every open file is
// in use, by as many files as there are concurrent callers (an Open
// recovers 16 partitions of a topic at once), and the next open trims the
// excess. Inactive segments'
// read handles are bounded per partition apart (MaxOpenSegmentReaders).
// Open opens 16 topics at a time and each topic's partitions 16 at a
// time (CreateTopic too), and Close closes 16 partitions at a time: an
// open or a close of thousands of partitions is mostly fsyncs and file
// opens, which the disk serves faster side by side.
//
// Fault model of the pool, and the tests that show it:
//   - A failed fsync before the close is not lost: it sticks to the file
//     (the descriptor is closed all the same, since after a failed fsync
//     Linux may have marked the dirty pages clean and a retry proves
//     nothing), and every later call on it returns the error, so the
//     partition's own next fsync (a checkpoint, a roll, Close, the
//     interval fsync) fails as if it had failed itself, and the broker
//     fails as under "Durability" above: the journal is kept and the
//     next open restores the data; TestFailedEvictionFsyncIsReported.
//   - No stale or foreign data: every descriptor of a file shares its page
//     cache, so a reopened file reads what was written through the closed
//     one; a reopen that finds another file under the name (compaction or
//     retention replaced or removed it meanwhile) fails rather than read
//     it; TestMaxOpenFilesBoundsSegmentDescriptors reads every record
//     back through reopened files, before and after a reopen.
//   - An evicted file's Sync is a no-op only when the eviction's fsync
//     succeeded and nothing was written since (a write reopens it).
//
// # Consumer group offsets (groups/offsets.log)
//
// An append-only file of frames: uint32 payload length | uint32 CRC32C of
// payload | payload, where the payload is uint16 group length, group, uint16
// topic length, topic, int32 partition, int64 offset, int32 leader epoch,
// int64 commit time (unix ms), uint32 metadata length, metadata. The last
// frame for a (group, topic, partition) wins; a frame whose offset is
// -2^63 deletes it (DeleteOffsets, for Kafka's DeleteGroups and
// OffsetDelete; a binary older than it would read that as an offset).
// Each CommitOffsets or DeleteOffsets call writes its frames and fsyncs
// once. A frame with topic "" and partition -1 is not an offset but the
// group's membership (SaveGroupMembership: the Kafka listener's
// coordinator saves a group's members, generation and assignments each
// time it becomes Stable or Empty, fsynced, and restores them when it
// starts, so a restart or takeover keeps the group; a binary older than
// it would list that frame as an offset of topic ""). A torn tail is cut
// aside like a segment's. Inspect (relay groups) reads the file through
// the same frame parser and the same application of frames as the open
// (readOffsets, applyOffsetFrame), without cutting anything, so it shows
// exactly the offsets a broker opened on the directory would have
// (TestInspectGroupsAsTheOpenReadsThem, FuzzInspectOffsets). The
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
// min.compaction.lag.ms limits compaction to the inactive segments before
// the first whose newest record is younger than the lag: that segment and
// those after it stay as written and do not shadow older records. A topic
// with cleanup.policy=delete,compact gets both, retention first. The
// janitor runs every JanitorInterval and at once after AlterTopicConfig
// (or KickJanitor), so a shorter retention takes effect when it is set.
//
// # Topic changes
//
// DeleteRecords moves a partition's log start to an offset at most the
// high watermark: log-start is replaced atomically first (so the new
// start is durable before it is acknowledged), then the whole segments
// below it are deleted; reads and ListOffsets start there even inside a
// segment that stays.
//
// AddPartitions raises a topic's partition count: the new partition
// directories are created and the topic directory fsynced before
// meta.json names the new count, so a crash in between leaves empty
// directories that no topic uses and the next AddPartitions reuses. It is
// a migration for the callers to confirm (keys move); KeyMovement counts,
// by reading the whole log, how many distinct keys would, and
// AddPartitionsMovingNoKey makes an increase that moves none without
// confirmation (reading the log again, from where the first reading
// ended, under the metadata lock just before meta.json changes; its doc
// says which window remains). DeleteTopic
// removes the topic from meta.json first, then moves its directory into
// DIR/deleted/ and removes it; a crash in between leaves either a
// topics/T no topic names (moved aside when T is created again) or
// DIR/deleted/... (removed at the next open). The journal may still hold
// the deleted topic's batches: replay skips them (no partition takes
// them), and until the broker reopens the name cannot be created again
// (ErrRecentlyDeleted), since a new topic of that name would take them.
//
// # Transactions (txns/state.log)
//
// The transaction coordinator (txn.go) follows Kafka's: a transactional id
// maps to a producer id and epoch; InitTransactional bumps the epoch, which
// fences every older instance, and aborts a transaction the previous
// instance left open. AddTxnPartitions and AddTxnGroup move the
// transaction to Ongoing; transactional batches are accepted only from the
// current epoch of an Ongoing transaction, for partitions it added;
// TxnCommitOffsets keeps a group's offsets pending in the transaction;
// EndTxn writes a control batch (a commit or abort marker, under the
// producer's id and epoch) to every partition of the transaction and, on
// commit, stores the pending offsets with the group's others. A
// transaction left Ongoing past its timeout is aborted by the coordinator
// with a bumped epoch, which fences the producer that abandoned it; that
// producer may still abort it and initialise again from its old epoch
// (KIP-588), until anyone initialises the id.
//
// The coordinator's state is an append-only file of frames like the group
// offsets file's (uint32 length | uint32 CRC32C | payload), the payload a
// JSON object with the whole state of one transactional id (producer id,
// epoch, timeout, state, partitions, groups, pending offsets, start time);
// the last frame per id wins, a torn tail is cut aside, and the file is
// rewritten atomically with live entries only once it passes 4 MiB and is
// mostly superseded. Every state change is written and fsynced before it is
// acted on or answered:
//
//	step                         persisted first                 then
//	InitProducerId               (new id: meta.json) Empty,e+1   answer
//	AddPartitionsToTxn/Offsets   Ongoing with the new members    answer
//	TxnOffsetCommit              Ongoing with the pending offsets answer
//	EndTxn                       PrepareCommit|PrepareAbort      markers (each fsynced,
//	                                                             under either sync policy),
//	                                                             offsets (commit), then
//	                                                             CompleteCommit|Abort, answer
//	timeout, fencing             PrepareAbort at epoch e+1       markers, CompleteAbort
//
// Recovery on open, after the journal replay: an id found in PrepareCommit
// or PrepareAbort has its markers written again to every partition and (on
// commit) its offsets stored again, then is completed; a second marker for a
// transaction a partition already closed changes nothing, and the offsets
// are the same values, so redoing a step a crash interrupted is harmless. An
// Ongoing transaction stays open (its producer may continue after the
// restart, as with a Kafka coordinator failover) until it ends or times out.
// The decision to commit is durable before any marker is written, so a
// read_committed consumer never sees data of a transaction that a crash
// could still abort.
//
// Each partition keeps its transactions in its producer state: per producer
// the first offset of its open transaction, and the list of aborted
// transactions (producer id, first offset, offset of the abort marker).
// Snapshot version 2 stores both (see Producer state); replaying the
// batch headers after the snapshot restores the rest, reading the marker
// type from each control batch. The last stable offset (LSO) is the
// smallest first offset of an open transaction, or the high watermark;
// read_committed fetches stop there and carry the aborted transactions
// overlapping what they return. Retention deletes a segment only when it
// ends at or below the LSO (it never deletes data of an open transaction),
// and compaction cleans only segments below the LSO, keeps every control
// batch, and lets no record of an aborted transaction shadow an older
// committed value of its key (aborted records are dropped instead).
//
// # Fault model
//
// What the log survives, and the test that shows it. The fault-injecting
// file system injectFS (faultfs_test.go) fails chosen writes (ENOSPC,
// short writes), fsyncs, reads and directory fsyncs (EIO), and models what
// a machine crash leaves: each file cut to its last good fsync, and the
// pages dirty at a failed fsync lost even after a later good one unless
// written again.
//
//   - Process kill at any point (SIGKILL): nothing acknowledged lost, no
//     duplicate; TestKillDuringAppend.
//
//   - Power loss: segments lose what no fsync covered, the journal restores
//     it; TestJournalRestoresWhatSegmentsLost,
//     TestTornWriteKeepsEarlierBatches.
//
//   - Torn or zero-filled tail: cut aside; TestCorruptTailRecovery.
//
//   - Full disk, short writes (ENOSPC): the append fails, the next one
//     works; TestDiskFaults, TestWriteAndReadFaults.
//
//   - fsync EIO on a segment or on the journal, under load: no append that
//     starts after the failure is acknowledged and the waiting ones fail;
//     nothing acknowledged is lost in the crash model; Reopen brings the
//     broker back, and a crash after it loses nothing either (that needs
//     the rewrite from the journal: without it the test fails);
//     TestFsyncEIOUnderLoad, TestDiskFaults,
//     TestJournalBoundsFileAfterFailedFsync,
//     TestReopensItselfWhenTheDiskWorksAgain.
//
//   - EIO on read: the fetch fails with ErrStorage (KAFKA_STORAGE_ERROR,
//     which clients retry) and nothing is reported lost;
//     TestWriteAndReadFaults.
//
//   - A flipped bit in the active segment after its recovery point:
//     repaired from the journal when it covers the batch (after a kill),
//     else reported lost with the exact offsets and the later batches kept
//     (after a clean stop); before the recovery point, found by reads and
//     the background check (see Recovery point);
//     TestFlippedByteInActiveSegmentAfterKill,
//     TestFlippedByteInActiveSegmentAfterCleanStop.
//
//   - A flipped bit in an inactive segment: found by a read, by the
//     background check, or on open when in its last batches, and reported
//     with the exact offsets; TestFlippedByteInInactiveSegment,
//     TestFlippedLastBatchOfInactiveSegmentFoundOnOpen, TestDumpReportsLostData,
//     and TestKgoConsumerGetsAnErrorForLostData in the protocol package.
//
//   - Offsets missing from every file (a segment cut while the journal
//     holds later batches, an inactive segment cut short): reported as a
//     gap; TestGapIsReported.
//
//   - A deleted partition directory: refused, or recreated and reported;
//     TestVanishedPartitionDirectory.
//
//   - Files edited while the broker is stopped after a clean close: the
//     open finds what it finds without the clean-close manifest;
//     TestCleanCloseManifestOperatorEdits, TestCleanCloseManifestDamaged.
//
//   - A crash after DeleteTopic or AddPartitions: the topic stays deleted
//     and its journaled batches do not return under its name; the new
//     partitions and what was acknowledged on them stay;
//     TestTopicChangesSurviveACrash.
//
//   - Crash or restart at any step of a transaction: an acknowledged
//     AddPartitionsToTxn, TxnOffsetCommit or EndTxn is never undone; a commit
//     decided (PrepareCommit durable) completes on restart, an undecided
//     transaction stays open until it ends or times out; a read_committed
//     consumer sees each committed record once and no aborted one;
//     TestTxnCoordinatorRecovery, TestTxnCrashAfterDecision,
//     TestTxnCompactionAndRetention, the consume-transform-produce tests
//     in the protocol package (processor and broker process SIGKILLed)
//     and TestRelayKilledDuringConsumeTransformProduce in internal/faults.
//
// Not survived: damage to meta.json, the group offsets file or the
// transaction state file beyond a torn tail; damage to a journal record
// whose batch no segment holds (reported lost, not repaired); damage in an inactive segment (reported,
// not repaired: the journal only covers active segments once they rolled
// and were fsynced); under SyncIntervalUnsafe, anything written since the
// last interval fsync.
//
// # Source files
//
// Each file owns one theme; a reader finds a function by what it does:
//
//	broker.go            the Broker type, its health, Reopen, Sync and Close
//	options.go           Options and SyncPolicy, their defaults and checks
//	open.go              Open: the directory lock, meta.json, the load of topics
//	topics.go            the topic table: create, alter, ensure, look up
//	topic_admin.go       partition increases, key movement, topic deletion
//	topic_config.go      TopicConfig, cleanup policies, Kafka config names
//	produce.go           Append, ProduceAsync, producer identities
//	fetch.go             Fetch, Wait, Watch, offsets and time lookups
//	partition.go         one partition: its state, readers, info and close
//	partition_recover.go a partition's open, tail recovery and reset
//	partition_append.go  a partition's appends and segment rolls
//	partition_sync.go    a partition's durability: waits, fsyncs, roll-back
//	partition_read.go    a partition's reads and verified batches
//	segment.go, batch.go, compress.go    segment files and record batches
//	producer.go, txn.go, txnindex.go     producer state, transactions
//	groups.go, offsetmap.go              consumer group offsets
//	journal.go, framelog.go, writeback.go, recoverypoint.go, cleanclose.go
//	                     the write path's durability and the open's shortcuts
//	janitor.go, scrub.go, delete_records.go, lost.go  retention, compaction,
//	                     background checks, DeleteRecords, lost ranges
//	health.go, fs.go, fdcache.go, errors.go          fsync health, the
//	                     FS interface, the file descriptor cache, errors
//	fsyncstats.go        fsync latency histograms and the slow-fsync
//	                     warning (timing only: an fsync's outcome and its
//	                     handling are health.go's, unchanged)
//	inspect.go, dump.go  read-only views for the relay's commands
package broker
