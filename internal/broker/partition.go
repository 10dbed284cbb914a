package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
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
	cfg            TopicConfig
	// journal, under SyncBeforeAck, makes appends durable with one fsync
	// for every partition (see journal.go); nil otherwise.
	journal *journal
}

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
	// hw is the high watermark, the end of what fetches may read. With
	// fsync-before-ack it equals durable, so consumers never see records a
	// crash could take back.
	hw, hwPos           int64
	durable, durablePos int64
	// gen counts rollbacks after failed fsyncs; resetPoints[g] is the durable
	// offset at which generation g ended, so an appender from generation g
	// knows whether its data survived.
	gen         int
	resetPoints []int64
	producers   producerTable
	hwCh        chan struct{}
	broken      error
	closed      bool
	clock       uint64

	syncMu  sync.Mutex
	cleanMu sync.Mutex
}

func openPartition(set *partitionSettings, dir, topic string, id int32) (*partition, error) {
	p := &partition{topic: topic, id: id, dir: dir, set: set, hwCh: make(chan struct{})}
	fsys := set.fs
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, storageErr("create partition dir", err)
	}
	bases, snaps, err := listSegmentBases(fsys, dir, true)
	if err != nil {
		return nil, storageErr("list segments", err)
	}
	if len(bases) == 0 {
		bases = []int64{0}
	}
	for _, base := range bases[:len(bases)-1] {
		s, err := p.openInactive(base)
		if err != nil {
			p.closeAll()
			return nil, err
		}
		p.segs = append(p.segs, s)
	}
	active := &segment{dir: dir, base: bases[len(bases)-1], maxTS: -1}
	p.segs = append(p.segs, active)
	if err := p.recoverActiveLocked(); err != nil {
		p.closeAll()
		return nil, err
	}
	p.rebuildProducersLocked(snaps)
	return p, nil
}

// openInactive sizes an older segment and makes sure its indexes are sound,
// rebuilding them from the log when they are missing or damaged. Its indexes
// are then dropped so memory does not grow with the number of segments.
func (p *partition) openInactive(base int64) (*segment, error) {
	fsys := p.set.fs
	s := &segment{dir: p.dir, base: base, maxTS: -1}
	f, err := fsys.OpenFile(segmentName(p.dir, base, logSuffix), os.O_RDONLY, 0)
	if err != nil {
		return nil, storageErr("open segment", err)
	}
	defer f.Close()
	if s.size, err = fileSize(f); err != nil {
		return nil, storageErr("stat segment", err)
	}
	if !s.loadIndexes(fsys) {
		p.set.logger.Warn("rebuilding segment indexes", "topic", p.topic, "partition", p.id, "base", base)
		if err := s.rebuildIndexes(fsys, f, p.set.indexInterval, true); err != nil {
			return nil, err
		}
	}
	s.idx, s.tidx, s.loaded = nil, nil, false
	return s, nil
}

// recoverActiveLocked verifies every batch of the active segment, cuts a
// torn or corrupt tail (keeping the cut bytes in a side file), and rebuilds
// the in-memory index. Only the active segment can have a torn tail: a
// segment is fsynced before the next one is created.
func (p *partition) recoverActiveLocked() error {
	fsys := p.set.fs
	s := p.segs[len(p.segs)-1]
	if s.log == nil {
		f, err := fsys.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
		if err != nil {
			return storageErr("open active segment", err)
		}
		s.log = f
		if err := fsys.SyncDir(p.dir); err != nil {
			return storageErr("fsync partition dir", err)
		}
	}
	size, err := fileSize(s.log)
	if err != nil {
		return storageErr("stat active segment", err)
	}
	s.idx, s.tidx, s.maxTS, s.bytesSinceIdx, s.created = nil, nil, -1, 0, 0
	expect := s.base
	end, scanErr := scanBatches(s.log, 0, size, true, func(h BatchHeader, pos int64, _ []byte) error {
		if h.BaseOffset < expect {
			return fmt.Errorf("%w: batch offset %d below expected %d", ErrCorruptBatch, h.BaseOffset, expect)
		}
		s.noteBatch(h, pos, p.set.indexInterval)
		expect = h.LastOffset() + 1
		return nil
	})
	if end < size {
		cut := segmentName(p.dir, s.base, fmt.Sprintf("%s%s%d", logSuffix, cutInfix, time.Now().UnixNano()))
		p.set.logger.Warn("truncating corrupt log tail", "topic", p.topic, "partition", p.id,
			"segment", s.base, "valid_bytes", end, "cut_bytes", size-end, "kept_in", cut, "reason", scanErr)
		if err := copyRange(fsys, s.log, end, size, cut); err != nil {
			return storageErr("save cut tail", err)
		}
		if err := s.log.Truncate(end); err != nil {
			return storageErr("truncate corrupt tail", err)
		}
		if err := s.log.Sync(); err != nil {
			return storageErr("fsync truncated segment", err)
		}
	}
	s.size = end
	s.loaded = true
	p.next = expect
	p.durable, p.durablePos = p.next, s.size
	p.hw, p.hwPos = p.next, s.size
	return nil
}

// rebuildProducersLocked loads the newest usable snapshot and replays the
// batch headers after it.
func (p *partition) rebuildProducersLocked(snaps []int64) {
	from, table := loadNewestSnapshot(p.set.fs, p.dir, snaps, p.next)
	if from < 0 {
		from = p.segs[0].base
	}
	for i, s := range p.segs {
		if i+1 < len(p.segs) && p.segs[i+1].base <= from {
			continue
		}
		f := s.log
		if f == nil {
			var err error
			f, err = p.set.fs.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
			if err != nil {
				continue
			}
		}
		_, _ = scanBatches(f, 0, s.size, false, func(h BatchHeader, _ int64, _ []byte) error {
			if h.BaseOffset >= from {
				table.update(h)
			}
			return nil
		})
		if f != s.log {
			_ = f.Close()
		}
	}
	p.producers = table
}

func (p *partition) notifyLocked() {
	close(p.hwCh)
	p.hwCh = make(chan struct{})
}

// AppendResult reports where a batch landed.
type AppendResult struct {
	// BaseOffset is the offset assigned to the batch's first record, or the
	// original offset when Duplicate is set.
	BaseOffset     int64
	LogStartOffset int64
	// Duplicate means the batch repeated one of the producer's last five
	// batches; nothing was written and BaseOffset is the original one.
	Duplicate bool
}

// write validates a batch against the producer state and writes it (or
// finds the duplicate it repeats). Under SyncBeforeAck the result may only
// be acknowledged once waitDurable(target, gen) succeeds; target is -1 when
// there is nothing to wait for.
func (p *partition) write(batch []byte, h BatchHeader) (res AppendResult, target int64, gen int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return AppendResult{}, -1, 0, ErrClosed
	}
	if p.broken != nil {
		if err := p.resetLocked(); err != nil {
			return AppendResult{}, -1, 0, err
		}
	}
	dup, err := p.producers.check(h)
	if err != nil {
		return AppendResult{}, -1, 0, err
	}
	target = -1
	if dup != nil {
		if p.set.syncBeforeAck {
			target = dup.LastOffset + 1
		}
		return AppendResult{BaseOffset: dup.FirstOffset, LogStartOffset: p.segs[0].base, Duplicate: true}, target, p.gen, nil
	}
	h.BaseOffset = p.next
	active, err := p.appendLocked(batch, h, p.set.journal)
	if err != nil {
		return AppendResult{}, -1, 0, err
	}
	res = AppendResult{BaseOffset: h.BaseOffset, LogStartOffset: p.segs[0].base}
	if p.set.syncBeforeAck {
		target = p.next
	} else {
		p.hw, p.hwPos = p.next, active.size
		p.notifyLocked()
	}
	return res, target, p.gen, nil
}

// appendLocked writes a batch at the log end (setting its base offset) to
// the active segment, rolling it first when due, and to j when given, then
// advances the partition's state over it. On a failed write the segment is
// cut back to where it was. It returns the segment written to.
func (p *partition) appendLocked(batch []byte, h BatchHeader, j *journal) (*segment, error) {
	active := p.segs[len(p.segs)-1]
	now := p.set.now()
	if p.needsRollLocked(active, h, now) {
		if err := p.rollLocked(); err != nil {
			return nil, err
		}
		active = p.segs[len(p.segs)-1]
	}
	setBaseOffset(batch, p.next)
	write := func() error {
		if _, err := active.log.Write(batch); err != nil {
			return storageErr("write segment", err)
		}
		if j != nil {
			return j.add(p, batch, h.LastOffset()+1, active.size+int64(len(batch)))
		}
		return nil
	}
	if err := write(); err != nil {
		// Put the file back as it was so a later append (after space is
		// freed) continues from a clean end; if even that fails, the next
		// append first rolls back to the durable state.
		if terr := active.log.Truncate(active.size); terr != nil {
			p.broken = terr
		}
		return nil, err
	}
	pos := active.size
	active.size += int64(len(batch))
	if active.created == 0 {
		active.created = now.UnixMilli()
	}
	active.noteBatch(h, pos, p.set.indexInterval)
	p.producers.update(h)
	p.next = h.LastOffset() + 1
	return active, nil
}

func (p *partition) needsRollLocked(s *segment, h BatchHeader, now time.Time) bool {
	if s.size == 0 {
		return false
	}
	cfg := p.set.cfg
	if s.size+int64(h.Size()) > cfg.SegmentBytes {
		return true
	}
	if cfg.SegmentMs > 0 && s.created > 0 && now.UnixMilli()-s.created >= cfg.SegmentMs {
		return true
	}
	// Index entries hold 32-bit relative offsets.
	return p.next+int64(h.LastOffsetDelta)-s.base > 1<<32-2
}

// rollLocked makes the active segment durable, freezes it, and starts a new
// one at the log end with a producer-state snapshot at its base.
func (p *partition) rollLocked() error {
	fsys := p.set.fs
	old := p.segs[len(p.segs)-1]
	if err := old.log.Sync(); err != nil {
		rerr := storageErr("fsync segment before roll", err)
		if err := p.resetLocked(); err != nil {
			return errors.Join(rerr, err)
		}
		return rerr
	}
	p.durable, p.durablePos = p.next, old.size
	p.hw, p.hwPos = p.next, old.size
	if err := writeIndexFiles(fsys, old); err != nil {
		return err
	}
	f, err := fsys.OpenFile(segmentName(p.dir, p.next, logSuffix), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return storageErr("create segment", err)
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		_ = f.Close()
		_ = fsys.Remove(segmentName(p.dir, p.next, logSuffix))
		return storageErr("fsync partition dir", err)
	}
	old.idx, old.tidx, old.loaded = nil, nil, false
	old.lastUse = p.tick()
	ns := &segment{dir: p.dir, base: p.next, maxTS: -1, log: f, loaded: true}
	p.segs = append(append([]*segment(nil), p.segs...), ns)
	p.durablePos, p.hwPos = 0, 0
	p.notifyLocked()
	if err := writeSnapshot(fsys, p.dir, p.next, p.producers); err != nil {
		// Not fatal: recovery replays from an older snapshot or the log.
		p.set.logger.Warn("producer snapshot failed", "topic", p.topic, "partition", p.id, "err", err)
	}
	p.evictReadersLocked()
	return nil
}

func writeIndexFiles(fsys FS, s *segment) error {
	ib := make([]byte, 0, len(s.idx)*offsetEntrySize)
	for _, e := range s.idx {
		ib = append(ib, encodeOffsetEntry(e)...)
	}
	tb := make([]byte, 0, len(s.tidx)*timeEntrySize)
	for _, e := range s.tidx {
		tb = append(tb, encodeTimeEntry(e)...)
	}
	if err := writeWholeFile(fsys, segmentName(s.dir, s.base, indexSuffix), ib, true); err != nil {
		return err
	}
	return writeWholeFile(fsys, segmentName(s.dir, s.base, timeIndexSuffix), tb, true)
}

func (p *partition) tick() uint64 {
	p.clock++
	return p.clock
}

// waitDurable returns once offsets below target are fsynced, fsyncing
// itself if no one else has. Appenders queue on syncMu while one fsync runs;
// the next one in line usually finds its data already covered.
func (p *partition) waitDurable(target int64, gen int) error {
	if j := p.set.journal; j != nil {
		return p.waitJournal(j, target, gen)
	}
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		if p.closed {
			if target <= p.durable {
				return nil
			}
			return ErrClosed
		}
		if gen != p.gen {
			if target <= p.resetPoints[gen] {
				return nil
			}
			return storageErr("append", errors.New("rolled back after a failed fsync"))
		}
		if target <= p.durable {
			return nil
		}
		if err := p.syncLocked(); err != nil {
			return err
		}
	}
}

// waitJournal is waitDurable when the journal makes appends durable: one
// journal fsync covers every record written before it started.
func (p *partition) waitJournal(j *journal, target int64, gen int) error {
	for attempt := 0; ; attempt++ {
		p.mu.Lock()
		done, err := p.durableLocked(target, gen)
		p.mu.Unlock()
		if done {
			return err
		}
		if attempt == 2 {
			return storageErr("append", errors.New("the journal fsync did not cover the batch"))
		}
		if serr := j.sync(); serr != nil {
			p.mu.Lock()
			done, err := p.durableLocked(target, gen)
			p.mu.Unlock()
			if done {
				return err
			}
			return serr
		}
	}
}

// durableLocked says whether a wait for target, written in generation gen,
// is over, and how it ended.
func (p *partition) durableLocked(target int64, gen int) (bool, error) {
	if gen != p.gen {
		if target <= p.resetPoints[gen] {
			return true, nil
		}
		return true, storageErr("append", errors.New("rolled back after a failed fsync"))
	}
	if target <= p.durable {
		return true, nil
	}
	if p.closed {
		return true, ErrClosed
	}
	return false, nil
}

// markDurable records that a journal fsync covered e.
func (p *partition) markDurable(e journalEntry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A roll since the write fsynced the segment and moved durable past
	// e.end; a rollback changed the generation.
	if p.gen != e.gen || e.end <= p.durable {
		return
	}
	p.durable, p.durablePos = e.end, e.endPos
	if p.durable > p.hw {
		p.hw, p.hwPos = p.durable, p.durablePos
		p.notifyLocked()
	}
}

// rollBack returns the partition to its durable state after a failed
// journal fsync, unless that already happened (gen moved on).
func (p *partition) rollBack(gen int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.gen != gen {
		return
	}
	if err := p.resetLocked(); err != nil {
		p.set.logger.Error("rolling back after a failed journal fsync", "topic", p.topic, "partition", p.id, "err", err)
	}
}

// syncSegment fsyncs the active segment, whatever the journal already made
// durable: a journal checkpoint does this before deleting journal files.
func (p *partition) syncSegment() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	s := p.segs[len(p.segs)-1]
	p.pinLocked(s)
	p.mu.Unlock()
	defer p.unpin(s)
	if err := s.log.Sync(); err != nil {
		return storageErr("fsync segment", err)
	}
	return nil
}

// replay appends a batch read back from the journal when it continues the
// log; a batch the log holds already is skipped. Used while the broker
// opens, before anything reads the partition.
func (p *partition) replay(batch []byte) (bool, error) {
	h, err := VerifyBatch(batch)
	if err != nil {
		p.set.logger.Error("skipping a damaged batch in the journal", "topic", p.topic, "partition", p.id, "err", err)
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case h.LastOffset() < p.next:
		return false, nil
	case h.BaseOffset != p.next:
		p.set.logger.Error("the journal holds a batch that does not continue the log", "topic", p.topic, "partition", p.id,
			"batch_offset", h.BaseOffset, "log_end", p.next)
		return false, nil
	}
	active, err := p.appendLocked(batch, h, nil)
	if err != nil {
		return false, err
	}
	p.durable, p.durablePos = p.next, active.size
	p.hw, p.hwPos = p.next, active.size
	return true, nil
}

// syncLocked fsyncs the active segment, dropping mu during the fsync so
// appends continue meanwhile. On failure the partition rolls back to its
// last durable state: after a failed fsync the kernel may have dropped the
// dirty pages, so nothing after that point can be trusted.
func (p *partition) syncLocked() error {
	s := p.segs[len(p.segs)-1]
	end, endPos, gen := p.next, s.size, p.gen
	if end <= p.durable {
		return nil
	}
	p.mu.Unlock()
	err := s.log.Sync()
	p.mu.Lock()
	if gen != p.gen {
		return nil
	}
	if err != nil {
		rerr := storageErr("fsync segment", err)
		if err := p.resetLocked(); err != nil {
			return errors.Join(rerr, err)
		}
		return rerr
	}
	if end > p.durable {
		p.durable, p.durablePos = end, endPos
	}
	if p.durable > p.hw {
		p.hw, p.hwPos = p.durable, p.durablePos
		p.notifyLocked()
	}
	return nil
}

// sync makes everything appended so far durable (used by the interval
// syncer and Close).
func (p *partition) sync() error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	return p.syncLocked()
}

// resetLocked truncates the active segment back to the last durable
// position and rebuilds index and producer state from disk.
func (p *partition) resetLocked() error {
	s := p.segs[len(p.segs)-1]
	if err := s.log.Truncate(p.durablePos); err != nil {
		p.broken = err
		return storageErr("truncate to durable position", err)
	}
	// The cut must be durable before other data takes those offsets: a
	// crash must not bring back a rolled-back batch in their place.
	if err := s.log.Sync(); err != nil {
		p.broken = err
		return storageErr("fsync truncated segment", err)
	}
	p.resetPoints = append(p.resetPoints, p.durable)
	p.gen++
	if err := p.recoverActiveLocked(); err != nil {
		p.broken = err
		return err
	}
	_, snaps, err := listSegmentBases(p.set.fs, p.dir, false)
	if err != nil {
		p.broken = err
		return storageErr("list snapshots", err)
	}
	p.rebuildProducersLocked(snaps)
	p.broken = nil
	p.set.logger.Warn("partition rolled back to durable state", "topic", p.topic, "partition", p.id, "offset", p.next)
	return nil
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
}

func (p *partition) fetch(offset int64, maxBytes int, buf []byte) (FetchResult, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return FetchResult{}, ErrClosed
		}
		res := FetchResult{HighWatermark: p.hw, LogStartOffset: p.segs[0].base}
		if offset < res.LogStartOffset || offset > p.hw {
			p.mu.Unlock()
			return res, fmt.Errorf("%w: offset %d, log %s/%d has [%d, %d]", ErrOffsetOutOfRange, offset, p.topic, p.id, res.LogStartOffset, p.hw)
		}
		if offset == p.hw {
			p.mu.Unlock()
			return res, nil
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
		pos := s.lookup(offset)
		nextBase := int64(-1)
		if i+1 < len(p.segs) {
			nextBase = p.segs[i+1].base
		}
		p.pinLocked(s)
		p.mu.Unlock()
		data, err := readBatchesFrom(s.log, pos, limit, offset, maxBytes, buf)
		p.unpin(s)
		if err != nil {
			return res, storageErr("read segment", err)
		}
		if len(data) > 0 || nextBase < 0 {
			res.Batches = data
			return res, nil
		}
		// The rest of this segment was compacted away: continue in the next.
		offset = nextBase
	}
}

// readBatchesFrom skips batches that end before offset, then reads whole
// batches up to maxBytes (at least one) without passing limit, into buf
// when it has the capacity.
func readBatchesFrom(f File, pos, limit, offset int64, maxBytes int, buf []byte) ([]byte, error) {
	var hdr [BatchHeaderSize]byte
	for pos < limit {
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return nil, err
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil {
			return nil, err
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
				return nil, err
			}
			return trimToBatches(buf), nil
		}
		pos += int64(h.Size())
	}
	return nil, nil
}

// trimToBatches cuts b after its last complete batch.
func trimToBatches(b []byte) []byte {
	end := 0
	for end+BatchHeaderSize <= len(b) {
		h, err := ParseBatchHeader(b[end:])
		if err != nil || end+h.Size() > len(b) {
			break
		}
		end += h.Size()
	}
	return b[:end]
}

// offsetForTime finds the first record with timestamp >= ts. With none it
// returns -1, -1 as Kafka's ListOffsets does.
func (p *partition) offsetForTime(ts int64) (int64, int64, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
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
}

func (p *partition) info() PartitionInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.segs {
		n += s.size
	}
	return PartitionInfo{Partition: p.id, LogStartOffset: p.segs[0].base, HighWatermark: p.hw, LogEndOffset: p.next, Bytes: n, Segments: len(p.segs)}
}

func (p *partition) close() error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	var errs []error
	active := p.segs[len(p.segs)-1]
	if err := active.log.Sync(); err != nil {
		errs = append(errs, storageErr("fsync on close", err))
	} else if p.broken == nil {
		p.durable = p.next
		if err := writeSnapshot(p.set.fs, p.dir, p.next, p.producers); err != nil {
			errs = append(errs, err)
		}
	}
	p.closed = true
	p.closeAll()
	p.notifyLocked()
	return errors.Join(errs...)
}

func (p *partition) closeAll() {
	for _, s := range p.segs {
		_ = s.closeFiles()
	}
}
