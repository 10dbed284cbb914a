package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// partitionSettings are the knobs a partition needs from the broker options
// and its topic configuration.
type partitionSettings struct {
	fs             FS
	syncBeforeAck  bool
	indexInterval  int
	maxOpenReaders int
	now            func() time.Time
	logger         *slog.Logger
	// cfg is the topic's configuration; AlterTopicConfig swaps it.
	cfg atomic.Pointer[TopicConfig]
	// journal, under SyncBeforeAck, makes appends durable with one fsync
	// for every partition (see journal.go); nil otherwise.
	journal *journal
	// allowLost opens a partition whose directory vanished (empty, with
	// the loss reported) instead of refusing.
	allowLost bool
	// health turns sticky on the first failed fsync (health.go).
	health *health
	// compactionMapBytes bounds compaction's key map (offsetmap.go).
	compactionMapBytes int64
}

// config returns the topic's current configuration.
func (s *partitionSettings) config() TopicConfig { return *s.cfg.Load() }

// partition is one ordered log: a list of segments, the last one active.
//
// Locking: mu guards the segment list, offsets, producer state and the
// active segment's in-memory index; appends hold it only for the write
// syscall. syncMu serialises fsyncs so concurrent appenders queue behind one
// fsync and are then all covered by it (group commit). cleanMu serialises
// retention and compaction. Lock order: syncMu, then mu, then segment.mu.
type partition struct {
	topic string
	id    int32
	dir   string
	set   *partitionSettings

	mu   sync.Mutex
	segs []*segment
	next int64 // log end offset: offset of the next appended record
	// appended counts the bytes of the batches appended since the
	// partition was opened (for the append-rate metrics).
	appended int64
	// hw is the high watermark, the end of what fetches may read. With
	// fsync-before-ack it equals durable, so consumers never see records a
	// crash could take back.
	hw, hwPos           int64
	durable, durablePos int64
	// gen counts rollbacks to the durable state; resetPoints[g] is where
	// and why generation g ended, so an appender from generation g knows
	// whether its data survived, and if not, why.
	gen         int
	resetPoints []resetPoint
	producers   producerTable
	// txns are the partition's open and aborted transactions, rebuilt
	// with producers.
	txns txnIndex
	// hwCh is closed when the high watermark next moves or the partition
	// closes. It is made when a listener asks for it (watchLocked), not at
	// every move: with thousands of partitions that nobody fetches from,
	// a channel made for each at every journal fsync was a visible share
	// of the appends' allocations.
	hwCh chan struct{}
	// lost are the ranges reported lost (lost.go); candidates is damage
	// found while opening that the journal may still repair.
	lost       []LostRange
	candidates []LostRange
	// journalEnd is the offset after the last batch the journal held for
	// the partition when it opened (0: none).
	journalEnd int64
	// broken is a failed rollback (its truncate or fsync): the next
	// append tries the rollback again.
	broken error
	// torn is a failed append's bytes past the active segment's size that
	// could not be cut at once: the next append (or Close) cuts them
	// first. The batches before them stay, as their journal records do.
	torn   error
	closed bool
	clock  uint64
	// startFloor is the log start DeleteRecords set (its file, logStartFile);
	// records below it are gone even where their segment stays.
	startFloor int64

	syncMu  sync.Mutex
	cleanMu sync.Mutex
	// dirDirty says the directory may hold an entry (the active segment
	// opened or created by openPartition) not yet fsynced into it.
	dirDirty atomic.Bool
}

// syncDirIfDirty fsyncs the partition directory if the active segment's
// entry may not be durable yet. Every path that makes the segment's
// contents durable in their own right (a checkpoint before it deletes the
// journal, Close, the interval or non-journal fsync) calls it first; a
// roll fsyncs the directory itself.
func (p *partition) syncDirIfDirty() error {
	if !p.dirDirty.Load() {
		return nil
	}
	if err := p.set.health.syncDir(p.set.fs, p.dir, "fsync partition dir"); err != nil {
		return err
	}
	p.dirDirty.Store(false)
	return nil
}

func (p *partition) notifyLocked() {
	if p.hwCh != nil {
		close(p.hwCh)
		p.hwCh = nil
	}
}

// closedChan is a channel that is closed, for a listener of a closed
// partition.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// watchLocked returns a channel closed the next time the high watermark
// moves or the partition closes; closed already when the partition is.
func (p *partition) watchLocked() <-chan struct{} {
	if p.closed {
		return closedChan
	}
	if p.hwCh == nil {
		p.hwCh = make(chan struct{})
	}
	return p.hwCh
}

// whileOpen runs fn holding syncMu and mu (lockForSync), unless the
// partition is closed.
func (p *partition) whileOpen(fn func() error) error {
	p.lockForSync()
	defer p.unlockSync()
	if p.closed {
		return nil
	}
	return fn()
}

// lockOpen locks p.mu and reports true; when the partition is closed it
// leaves p.mu unlocked and reports false, so that the caller can return
// at once without an unlock of its own.
func (p *partition) lockOpen() bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	return true
}

// pinLocked keeps s's file open while it is read outside mu.
func (p *partition) pinLocked(s *segment) {
	s.refs++
	s.lastUse = p.tick()
}

func (p *partition) unpin(s *segment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.refs--
	if s.deleted && s.refs == 0 {
		_ = s.closeFiles()
	}
	p.evictReadersLocked()
}

// evictReadersLocked closes the least recently used inactive segment
// handles beyond the limit, so open files stay bounded however long the log.
func (p *partition) evictReadersLocked() {
	var open []*segment
	for _, s := range p.segs[:len(p.segs)-1] {
		if s.log != nil && s.refs == 0 {
			open = append(open, s)
		}
	}
	if len(open) <= p.set.maxOpenReaders {
		return
	}
	sort.Slice(open, func(i, j int) bool { return open[i].lastUse < open[j].lastUse })
	for _, s := range open[:len(open)-p.set.maxOpenReaders] {
		_ = s.closeFiles()
		s.idx, s.tidx, s.loaded = nil, nil, false
	}
}

// ensureOpenLocked opens a pinned inactive segment's log and loads its
// indexes. Called with mu held; the I/O is small (an index file).
func (p *partition) ensureOpenLocked(s *segment) error {
	if s.log == nil {
		f, err := p.set.fs.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
		if err != nil {
			return storageErr("open segment", err)
		}
		s.log = f
	}
	if !s.loaded && !s.loadIndexes(p.set.fs) {
		if err := s.rebuildIndexes(p.set.fs, s.log, p.set.indexInterval, false); err != nil {
			return err
		}
	}
	return nil
}

// FetchResult holds whole stored batches, byte for byte as appended (the
// first one may start before the requested offset, as in Kafka).
type FetchResult struct {
	Batches        []byte
	HighWatermark  int64
	LogStartOffset int64
	// LastStableOffset is the first offset of the oldest open
	// transaction, or the high watermark when none is open.
	LastStableOffset int64
	// Aborted lists, for a read_committed fetch, the aborted transactions
	// overlapping the returned batches.
	Aborted []AbortedTxn
}

// fetch reads from offset; committed stops at the last stable offset and
// fills the aborted transactions (read_committed).
func (p *partition) fetch(offset int64, maxBytes int, buf []byte, committed bool) (FetchResult, error) {
	for {
		if !p.lockOpen() {
			return FetchResult{}, ErrClosed
		}
		res := FetchResult{HighWatermark: p.hw, LogStartOffset: p.logStartLocked(), LastStableOffset: p.txns.stable(p.hw)}
		if offset < res.LogStartOffset || offset > p.hw {
			p.mu.Unlock()
			return res, fmt.Errorf("%w: offset %d, log %s/%d has [%d, %d]", ErrOffsetOutOfRange, offset, p.topic, p.id, res.LogStartOffset, p.hw)
		}
		bound := p.hw
		if committed {
			bound = res.LastStableOffset
		}
		if offset >= bound {
			p.mu.Unlock()
			return res, nil
		}
		var lost []LostRange
		if len(p.lost) > 0 {
			if r, ok := p.lostAtLocked(offset); ok {
				p.mu.Unlock()
				return res, p.lostErr(r)
			}
			lost = append(lost, p.lost...)
		}
		i := sort.Search(len(p.segs), func(i int) bool { return p.segs[i].base > offset }) - 1
		s := p.segs[i]
		limit := s.size
		if i == len(p.segs)-1 {
			limit = p.hwPos
		}
		if err := p.ensureOpenLocked(s); err != nil {
			p.mu.Unlock()
			return res, err
		}
		pos, first := s.lookup(offset)
		nextBase := int64(-1)
		if i+1 < len(p.segs) {
			nextBase = p.segs[i+1].base
		}
		end := p.segmentEndLocked(i)
		if i == len(p.segs)-1 {
			end = p.hw
		}
		damaged := s.damaged
		p.pinLocked(s)
		p.mu.Unlock()
		data, bad, err := readBatchesFrom(s.log, pos, limit, offset, maxBytes, buf, damaged)
		if err == nil && bad.pos >= 0 {
			// The batch holding offset fails its CRC: never serve the
			// log as if it ended there.
			size, last := locateDamage(s.log, bad.pos, limit, max(first, bad.first), end)
			p.mu.Lock()
			deleted := s.deleted
			var r LostRange
			if !deleted {
				r = p.recordLostLocked(LostRange{First: max(first, bad.first), Last: last, Segment: s.base, Pos: bad.pos, Size: size,
					Reason: "damaged batch found by a read: " + bad.err.Error()})
			}
			p.mu.Unlock()
			p.unpin(s)
			if deleted {
				// Retention or compaction replaced the segment meanwhile.
				continue
			}
			return res, p.lostErr(r)
		}
		p.unpin(s)
		if err != nil {
			return res, storageErr("read segment", err)
		}
		if r, ok := nextLost(lost, offset); ok && len(data) > 0 {
			// Serve up to the next lost range, so that the next fetch
			// asks for it and fails instead of skipping it.
			if data = batchesBefore(data, r.First); len(data) == 0 {
				return res, p.lostErr(r)
			}
		}
		if bound < res.HighWatermark && len(data) > 0 {
			data = batchesBefore(data, bound)
		}
		if len(data) > 0 || nextBase < 0 {
			res.Batches = data
			if committed && len(data) > 0 {
				last := lastOffsetIn(data)
				p.mu.Lock()
				res.Aborted = p.txns.abortedIn(offset, last)
				p.mu.Unlock()
			}
			return res, nil
		}
		// The rest of this segment was compacted away: continue in the next.
		offset = nextBase
	}
}

// nextLost returns the first lost range of known extent above offset.
func nextLost(lost []LostRange, offset int64) (LostRange, bool) {
	var next LostRange
	found := false
	for _, r := range lost {
		if r.Last >= r.First && r.First > offset && (!found || r.First < next.First) {
			next, found = r, true
		}
	}
	return next, found
}

// lastOffsetIn is the last offset of the last whole batch in b.
func lastOffsetIn(b []byte) int64 {
	last := int64(-1)
	for pos := 0; pos+BatchHeaderSize <= len(b); {
		h, err := ParseBatchHeader(b[pos:])
		if err != nil {
			break
		}
		last = h.LastOffset()
		pos += h.Size()
	}
	return last
}

// batchesBefore cuts b before its first batch reaching offset end.
func batchesBefore(b []byte, end int64) []byte {
	pos := 0
	for pos+BatchHeaderSize <= len(b) {
		h, err := ParseBatchHeader(b[pos:])
		if err != nil || h.LastOffset() >= end {
			break
		}
		pos += h.Size()
	}
	return b[:pos]
}

// badBatch is where a read met a damaged batch (pos -1: it did not), with
// the lowest offset it can hold and why it failed.
type badBatch struct {
	pos   int64
	first int64
	err   error
}

// readBatchesFrom skips batches that end before offset, then reads whole
// batches up to maxBytes (at least one) without passing limit, into buf
// when it has the capacity, hopping over the damaged spans. Every batch
// returned passed its CRC check; the result stops before the first one
// that does not, and when that is the first batch it is returned as bad
// instead.
func readBatchesFrom(f File, pos, limit, offset int64, maxBytes int, buf []byte, damaged []span) ([]byte, badBatch, error) {
	var hdr [BatchHeaderSize]byte
	first := int64(-1)
	for pos < limit {
		if n := skipAt(damaged, pos); n > 0 {
			pos += n
			continue
		}
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return nil, badBatch{pos: -1}, err
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil || int64(h.Size()) > limit-pos {
			if err == nil {
				err = fmt.Errorf("%w: batch of %d bytes at %d runs past end %d", ErrCorruptBatch, h.Size(), pos, limit)
			}
			return nil, badBatch{pos: pos, first: first, err: err}, nil
		}
		if h.LastOffset() >= offset {
			n := min(int64(maxBytes), limit-pos)
			if n < int64(h.Size()) {
				n = int64(h.Size())
			}
			if int64(cap(buf)) >= n {
				buf = buf[:n]
			} else {
				buf = make([]byte, n)
			}
			if _, err := f.ReadAt(buf, pos); err != nil {
				return nil, badBatch{pos: -1}, err
			}
			out, verr := verifiedBatches(buf, pos, damaged)
			if len(out) == 0 && verr != nil {
				return nil, badBatch{pos: pos, first: first, err: verr}, nil
			}
			return out, badBatch{pos: -1}, nil
		}
		first = h.LastOffset() + 1
		pos += int64(h.Size())
	}
	return nil, badBatch{pos: -1}, nil
}

// verifiedBatches cuts b (read from file position pos) after its last
// complete batch, or before the first one that fails its CRC check or
// starts a damaged span, returning that failure.
func verifiedBatches(b []byte, pos int64, damaged []span) ([]byte, error) {
	end := 0
	for end+BatchHeaderSize <= len(b) {
		if skipAt(damaged, pos+int64(end)) > 0 {
			return b[:end], fmt.Errorf("%w: damaged batch at %d", ErrCorruptBatch, pos+int64(end))
		}
		h, err := ParseBatchHeader(b[end:])
		if err != nil {
			return b[:end], err
		}
		if end+h.Size() > len(b) {
			break
		}
		if _, err := VerifyBatch(b[end : end+h.Size()]); err != nil {
			return b[:end], err
		}
		end += h.Size()
	}
	return b[:end], nil
}

// offsetForTime finds the first record with timestamp >= ts. With none it
// returns -1, -1 as Kafka's ListOffsets does.
func (p *partition) offsetForTime(ts int64) (int64, int64, error) {
	if !p.lockOpen() {
		return 0, 0, ErrClosed
	}
	var s *segment
	limit := int64(0)
	for i, c := range p.segs {
		if i == len(p.segs)-1 || c.maxTS >= ts {
			s, limit = c, c.size
			if i == len(p.segs)-1 {
				limit = p.hwPos
			}
			if c.maxTS >= ts {
				break
			}
			s = nil
		}
	}
	if s == nil {
		p.mu.Unlock()
		return -1, -1, nil
	}
	if err := p.ensureOpenLocked(s); err != nil {
		p.mu.Unlock()
		return 0, 0, err
	}
	pos := s.lookupTime(ts)
	p.pinLocked(s)
	p.mu.Unlock()
	defer p.unpin(s)
	off, found := int64(-1), int64(-1)
	errStop := errors.New("found")
	_, err := scanBatches(s.log, pos, limit, true, func(h BatchHeader, _ int64, b []byte) error {
		if h.MaxTimestamp < ts {
			return nil
		}
		recs, err := decodeRecords(h, b, maxDecompressedSize)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.Timestamp.UnixMilli() >= ts {
				off, found = r.Offset, r.Timestamp.UnixMilli()
				return errStop
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return 0, 0, storageErr("scan for timestamp", err)
	}
	return off, found, nil
}

// PartitionInfo describes one partition's extent.
type PartitionInfo struct {
	Partition      int32
	LogStartOffset int64
	HighWatermark  int64
	// LogEndOffset can be ahead of HighWatermark while an fsync is pending.
	LogEndOffset int64
	Bytes        int64
	Segments     int
	// AppendedBytes are the bytes of the batches appended since the
	// broker opened the partition.
	AppendedBytes int64
	// Lost are the offset ranges found damaged or missing and not
	// repaired: the partition has a gap there (see LostRange).
	Lost []LostRange
}

func (p *partition) info() PartitionInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.segs {
		n += s.size
	}
	pi := PartitionInfo{Partition: p.id, LogStartOffset: p.logStartLocked(), HighWatermark: p.hw, LogEndOffset: p.next, Bytes: n,
		Segments: len(p.segs), AppendedBytes: p.appended}
	if len(p.lost) > 0 {
		pi.Lost = append([]LostRange(nil), p.lost...)
	}
	return pi
}

func (p *partition) close() error { return p.whileOpen(p.closeLocked) }

func (p *partition) closeLocked() error {
	var errs []error
	active := p.segs[len(p.segs)-1]
	if err := p.cutTornLocked(); err != nil {
		// torn stays set, so nothing below claims the segment sound; the
		// next open finds the torn bytes and cuts them.
		errs = append(errs, err)
	}
	// After a storage failure nothing written since is trusted: no fsync
	// to believe, no snapshot; the next open recovers from disk. A
	// segment whose last recovery frame is at its end (nothing appended
	// since the frame, as after an open and close with no appends) needs
	// neither: the frame was written after an fsync that covered it all.
	if p.set.health.check() == nil && !p.recoveryPointCurrentLocked(active) {
		// An empty active segment lost in a crash is created again: its
		// directory entry need not be durable.
		var err error
		if active.size > 0 {
			err = p.syncDirIfDirty()
		}
		if err != nil {
			errs = append(errs, err)
		} else if err := p.set.health.sync(active.log, "fsync on close"); err != nil {
			errs = append(errs, err)
		} else if p.broken == nil && p.torn == nil {
			p.durable = p.next
			// The recovery point holds the producer state; a snapshot is
			// written only without one (an empty active segment has the
			// snapshot its roll wrote, or no producers).
			wrote := false
			if st, ok := p.recoveryStateLocked(active); ok {
				wrote = p.writeRecoveryLocked(active, st)
			}
			if !wrote && active.size > 0 {
				if err := writeSnapshot(p.set.fs, p.dir, p.next, p.producers, p.txns); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	p.closed = true
	p.closeAll()
	p.notifyLocked()
	return errors.Join(errs...)
}

// recoveryPointCurrentLocked says that s's recovery file ends with a sound
// frame at the partition's end: every byte of s was fsynced before that
// frame was written, and nothing was appended since.
func (p *partition) recoveryPointCurrentLocked(s *segment) bool {
	return p.broken == nil && p.torn == nil && !s.rpStale && s.rpNext >= 0 && s.rpNext == p.next
}

// closeAll closes the files of every segment nobody reads. A segment a
// reader has pinned (a fetch, the background check, an interval fsync
// reads its handle without p.mu) is marked deleted instead, and its last
// unpin closes it: closing under a reader would leave it a nil handle.
func (p *partition) closeAll() {
	for _, s := range p.segs {
		if s.refs > 0 {
			s.deleted = true
			continue
		}
		_ = s.closeFiles()
	}
}
