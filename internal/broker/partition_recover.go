package broker

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// openPartition opens the partition in dir; clean, when not nil, is its
// entry in the clean-close manifest, used in place of listing dir when dir
// is as the close left it.
func openPartition(set *partitionSettings, dir, topic string, id int32, mustExist bool, clean *cleanEntry) (*partition, error) {
	p := &partition{topic: topic, id: id, dir: dir, set: set}
	fsys := set.fs
	var vanished bool
	var (
		bases, snaps []int64
		present      map[string]bool
		cached       []byte
		err          error
		ok           bool
	)
	if clean != nil {
		if bases, snaps, present, ok = clean.listing(fsys, dir); ok {
			cached = clean.recovery
		}
	}
	if !ok {
		// One directory read tells both whether the partition exists and
		// what it holds: with thousands of partitions, a second read per
		// partition was a visible share of the broker's open.
		bases, snaps, present, err = listPartitionDir(fsys, dir, true)
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		if mustExist {
			if !set.allowLost {
				return nil, fmt.Errorf("%w: %s/%d: %s is gone though %s lists the topic, so its records are lost; restore it, or open with AllowLostPartitions (relay: --allow-lost-partitions) to recreate it empty and report the loss",
					ErrPartitionLost, topic, id, dir, metaFile)
			}
			vanished = true
		}
		if err := fsys.MkdirAll(dir, 0o755); err != nil {
			return nil, storageErr("create partition dir", err)
		}
	case err != nil:
		return nil, storageErr("list segments", err)
	}
	if len(bases) == 0 {
		bases = []int64{0}
	}
	for _, base := range bases[:len(bases)-1] {
		p.segs = append(p.segs, &segment{dir: dir, base: base, maxTS: -1})
	}
	active := &segment{dir: dir, base: bases[len(bases)-1], maxTS: -1}
	p.segs = append(p.segs, active)
	if present[lostFile] {
		if err := p.loadLostLocked(); err != nil {
			return nil, err
		}
	}
	for i, s := range p.segs[:len(p.segs)-1] {
		if err := p.openInactive(s, p.segs[i+1].base); err != nil {
			p.closeAll()
			return nil, err
		}
	}
	// The listing says whether the active segment has a recovery point:
	// most partitions of a topic of many are empty, and looking for a
	// file that is not there costs a path walk each.
	cands, err := p.recoverActiveLocked(present[segmentName("", active.base, recoverySuffix)], cached)
	if err != nil {
		p.closeAll()
		return nil, err
	}
	p.candidates = cands
	if !set.syncBeforeAck {
		// No journal can repair the active segment: report now.
		p.settleDamageLocked()
	}
	p.rebuildProducersLocked(snaps)
	if present[logStartFile] {
		if p.startFloor, err = readLogStart(fsys, dir); err != nil {
			p.closeAll()
			return nil, err
		}
	}
	if vanished {
		p.recordLostLocked(LostRange{First: 0, Last: -1, Segment: -1,
			Reason: "partition directory vanished while the broker was stopped; recreated empty, the extent of the loss is unknown"})
	}
	return p, nil
}

// openInactive sizes an older segment and makes sure its indexes are sound,
// rebuilding them from the log when they are missing or damaged, then
// checks its last batches (from the last index entry on): a segment is
// fsynced before the next one starts, so damage there is not a torn write
// but lost data. Its indexes are then dropped so memory does not grow with
// the number of segments. end is the next segment's base.
func (p *partition) openInactive(s *segment, end int64) error {
	fsys := p.set.fs
	f, err := fsys.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
	if err != nil {
		return storageErr("open segment", err)
	}
	defer f.Close()
	if s.size, err = fileSize(f); err != nil {
		return storageErr("stat segment", err)
	}
	if !s.loadIndexes(fsys) {
		p.set.logger.Warn("rebuilding segment indexes", "topic", p.topic, "partition", p.id, "base", s.base)
		if err := s.rebuildIndexes(fsys, f, p.set.indexInterval, true); err != nil {
			return err
		}
	}
	pos, first := int64(0), s.base
	if n := len(s.idx); n > 0 {
		pos, first = int64(s.idx[n-1].pos), s.base+int64(s.idx[n-1].rel)
	}
	last := p.verifyRangeLocked(s, f, pos, s.size, first, end, "damaged batch at the end of an inactive segment, found on open")
	// Offsets are dense up to the next segment, except where compaction
	// removed records.
	if last < end && !p.set.config().CleanupPolicy.Compacts() {
		p.recordLostLocked(LostRange{First: last, Last: end - 1, Segment: -1,
			Reason: fmt.Sprintf("inactive segment %d ends before the next segment's base, found on open", s.base)})
	}
	s.idx, s.tidx, s.loaded = nil, nil, false
	return nil
}

// verifyRangeLocked checks the CRC of every batch of s in [pos, limit),
// whose first offset is at least first and whose offsets end before end,
// reporting each damaged one as lost. It returns the offset after the last
// batch, good or reported.
func (p *partition) verifyRangeLocked(s *segment, f File, pos, limit, first, end int64, reason string) int64 {
	for pos < limit {
		stop, err := scanBatchesSkip(f, pos, limit, true, s.damaged, func(h BatchHeader, _ int64, _ []byte) error {
			first = h.LastOffset() + 1
			return nil
		})
		if err == nil || stop >= limit {
			break
		}
		size, last := locateDamage(f, stop, limit, first, end)
		p.recordLostLocked(LostRange{First: first, Last: last, Segment: s.base, Pos: stop, Size: size, Reason: reason + ": " + err.Error()})
		pos, first = stop+size, last+1
	}
	for _, r := range p.lost {
		if r.Segment == s.base && r.Last+1 > first && r.Last < end {
			first = r.Last + 1
		}
	}
	return first
}

// recoverActiveLocked verifies every batch of the active segment and
// rebuilds the in-memory index. A damaged batch followed by good ones is
// bit rot, not a torn write: it stays in place and is returned as a lost
// candidate (the journal may still repair it, see settleDamageLocked), and
// the batches after it are kept. A damaged or torn tail is cut (the bytes
// kept in a side file); when it was a whole batch whose CRC fails, it is a
// candidate too. Only the active segment can have a torn tail: a segment is
// fsynced before the next one is created. listed false says the
// partition's directory, listed under the lock, holds no recovery point;
// cached, when not nil, is the recovery file's content, from the
// clean-close manifest.
func (p *partition) recoverActiveLocked(listed bool, cached []byte) ([]LostRange, error) {
	fsys := p.set.fs
	s := p.segs[len(p.segs)-1]
	if s.log == nil {
		f, err := fsys.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
		if err != nil {
			return nil, storageErr("open active segment", err)
		}
		s.log = f
		// The segment's directory entry is made durable before anything
		// relies on the file's contents being durable (syncDirIfDirty),
		// not here: an empty segment lost in a crash is created again,
		// and a topic of thousands of partitions is created, and opened,
		// without one directory fsync each.
		p.dirDirty.Store(true)
	}
	size, err := fileSize(s.log)
	if err != nil {
		return nil, storageErr("stat active segment", err)
	}
	s.idx, s.tidx, s.maxTS, s.bytesSinceIdx, s.created = nil, nil, -1, 0, 0
	s.hasLast, s.rpGen = false, s.rpGen+1
	p.attachDamageLocked()
	expect, start := s.base, int64(0)
	if st, idx, tidx, clean, err := loadRecoveryPoint(fsys, s, s.log, size, listed, cached); err == nil {
		// Trust what an fsync covered and the point's check passed; scan
		// the rest (see Recovery in doc.go).
		s.idx, s.tidx, s.maxTS, s.created, s.bytesSinceIdx = idx, tidx, st.maxTS, st.created, st.sinceIdx
		s.last, s.lastPos, s.hasLast = st.last, st.lastPos, true
		s.rpIdx, s.rpTidx, s.rpStale, s.rpNext, s.rpSnap = st.nIdx, st.nTidx, !clean, st.next, st.snap
		expect, start = st.next, st.pos
	} else {
		if !errors.Is(err, errNoRecoveryPoint) {
			p.set.logger.Warn("recovery point unusable; scanning the whole active segment", "topic", p.topic, "partition", p.id,
				"segment", s.base, "reason", err)
			// Removed (durably), so that no later crash finds it again
			// beside data it does not describe.
			if rerr := fsys.Remove(segmentName(p.dir, s.base, recoverySuffix)); rerr == nil {
				if err := p.set.health.syncDir(fsys, p.dir, "fsync partition dir"); err != nil {
					return nil, err
				}
			}
		}
		s.rpIdx, s.rpTidx, s.rpStale, s.rpNext, s.rpSnap = 0, 0, true, -1, nil
	}
	var cands []LostRange
	var end int64
	var scanErr error
	for pos := start; ; {
		end, scanErr = scanBatchesSkip(s.log, pos, size, true, s.damaged, func(h BatchHeader, pos int64, _ []byte) error {
			if h.BaseOffset < expect {
				return fmt.Errorf("%w: batch offset %d below expected %d", ErrCorruptBatch, h.BaseOffset, expect)
			}
			s.noteBatch(h, pos, p.set.indexInterval)
			expect = h.LastOffset() + 1
			return nil
		})
		if end >= size {
			break
		}
		var hdr [BatchHeaderSize]byte
		h, herr := BatchHeader{}, error(nil)
		if size-end >= BatchHeaderSize {
			if _, herr = s.log.ReadAt(hdr[:], end); herr == nil {
				h, herr = ParseBatchHeader(hdr[:])
			}
		} else {
			herr = ErrCorruptBatch
		}
		if herr != nil || int64(h.Size()) > size-end {
			break // torn: cut below
		}
		next := end + int64(h.Size())
		nh, ok := goodBatchAt(s.log, next, size)
		if !ok || nh.BaseOffset < expect {
			// Whole batches in the cut tail, the first one damaged: lost
			// unless the journal restores them or shows they were never
			// acknowledged (settleDamageLocked).
			if last, ok := cutTailEnd(s.log, end, size, expect); ok {
				cands = append(cands, LostRange{First: expect, Last: last, Segment: -1,
					Reason: "damaged batches at the end of the active segment, cut on open: " + scanErr.Error()})
			}
			break
		}
		cands = append(cands, LostRange{First: expect, Last: nh.BaseOffset - 1, Segment: s.base, Pos: end, Size: int64(h.Size()),
			Reason: "damaged batch in the active segment, found on open: " + scanErr.Error()})
		s.damaged = append(s.damaged, span{pos: end, size: int64(h.Size())})
		s.bytesSinceIdx += h.Size()
		expect = nh.BaseOffset
		pos = next
	}
	if end < size {
		cut := segmentName(p.dir, s.base, fmt.Sprintf("%s%s%d", logSuffix, cutInfix, time.Now().UnixNano()))
		p.set.logger.Warn("truncating corrupt log tail", "topic", p.topic, "partition", p.id,
			"segment", s.base, "valid_bytes", end, "cut_bytes", size-end, "kept_in", cut, "reason", scanErr)
		if err := copyRange(fsys, s.log, end, size, cut); err != nil {
			return nil, storageErr("save cut tail", err)
		}
		if err := s.log.Truncate(end); err != nil {
			return nil, storageErr("truncate corrupt tail", err)
		}
		if err := p.set.health.sync(s.log, "fsync truncated segment"); err != nil {
			return nil, err
		}
	}
	s.size = end
	s.loaded = true
	p.next = expect
	p.durable, p.durablePos = p.next, s.size
	p.hw, p.hwPos = p.next, s.size
	return cands, nil
}

// cutTailEnd walks the whole batches of a tail about to be cut, from pos
// up to limit, the first of them damaged, and returns the last offset they
// held. Only batches that look like ones the broker wrote count: the base
// offset (which the broker sets, outside the CRC) continuing the log, and
// for a damaged one a last offset delta smaller than its size. ok is false
// when the tail is not such a batch (random bytes, a torn write).
func cutTailEnd(f File, pos, limit, expect int64) (last int64, ok bool) {
	var hdr [BatchHeaderSize]byte
	next := expect
	for limit-pos >= BatchHeaderSize {
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			break
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil || int64(h.Size()) > limit-pos {
			break
		}
		if g, good := goodBatchAt(f, pos, limit); good && g.BaseOffset >= next && g.BaseOffset-next < 1<<20 {
			next = g.LastOffset() + 1
		} else if h.BaseOffset == next && h.LastOffsetDelta >= 0 && int(h.LastOffsetDelta) < h.Size() {
			next = h.LastOffset() + 1
		} else {
			break
		}
		pos += int64(h.Size())
	}
	return next - 1, next > expect
}

// settleDamageLocked reports the damage recovery found in the active
// segment and the journal did not repair: a candidate whose bytes are still
// in place is lost; a cut tail is lost unless the log now holds its offsets
// again, or the journal's batches for the partition end before it (it was
// written after the last one acknowledged, so never acknowledged).
func (p *partition) settleDamageLocked() {
	active := p.segs[len(p.segs)-1]
	for _, c := range p.candidates {
		if c.Segment < 0 && p.journalEnd > 0 && c.First >= p.journalEnd {
			p.set.logger.Warn("cut unacknowledged batches from the active segment", "topic", p.topic, "partition", p.id,
				"first_offset", c.First, "last_offset", c.Last)
			continue
		}
		if c.Segment >= 0 {
			if c.Segment != active.base || c.Pos+c.Size > active.size || skipAt(active.damaged, c.Pos) == 0 {
				p.set.logger.Warn("damaged batch repaired from the journal", "topic", p.topic, "partition", p.id,
					"first_offset", c.First, "last_offset", c.Last)
				continue
			}
		} else if p.next > c.Last {
			p.set.logger.Warn("damaged batch repaired from the journal", "topic", p.topic, "partition", p.id,
				"first_offset", c.First, "last_offset", c.Last)
			continue
		}
		p.recordLostLocked(c)
	}
	p.candidates = nil
	for _, r := range p.lost {
		if r.Last >= p.next {
			// Those offsets were handed out: new appends start after them.
			p.next = r.Last + 1
			p.durable, p.hw = p.next, p.next
		}
	}
}

// rebuildProducersLocked loads the newest usable snapshot and replays the
// batch headers after it.
func (p *partition) rebuildProducersLocked(snaps []int64) {
	from, table, txns := loadNewestSnapshot(p.set.fs, p.dir, snaps, p.next)
	if active := p.segs[len(p.segs)-1]; active.rpSnap != nil {
		// The recovery point's producer state, when newer.
		if off, t, x, err := decodeSnapshot(active.rpSnap); err == nil && off > from && off <= p.next {
			from, table, txns = off, t, x
		}
		active.rpSnap = nil
	}
	if from < 0 {
		from = p.segs[0].base
	}
	var peek [controlPeek]byte
	for i, s := range p.segs {
		// A segment that ends at or below from has nothing to replay: the
		// next one starts there, or, for the active segment, the state is
		// as of the log's end (a recovery point's, after a clean close).
		end := p.next
		if i+1 < len(p.segs) {
			end = p.segs[i+1].base
		}
		if end <= from {
			continue
		}
		f := s.log
		if f == nil {
			var err error
			f, err = p.set.fs.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
			if err != nil {
				p.producerStateIncomplete(s, err)
				continue
			}
		}
		start := int64(0)
		if s.loaded && from > s.base {
			// Headers before the index entry at or below from are skipped
			// anyway: do not read them.
			start, _ = s.lookup(from)
		}
		_, err := scanBatchesSkip(f, start, s.size, false, s.damaged, func(h BatchHeader, pos int64, _ []byte) error {
			if h.BaseOffset < from {
				return nil
			}
			table.update(h)
			marker := int16(-1)
			if h.Control() {
				n, _ := f.ReadAt(peek[:min(len(peek), h.Size())], pos)
				marker = controlType(peek[:n])
			}
			txns.note(h, marker)
			return nil
		})
		if err != nil {
			p.producerStateIncomplete(s, err)
		}
		if f != s.log {
			_ = f.Close()
		}
	}
	p.producers = table
	txns.prune(p.segs[0].base)
	p.txns = txns
}

// producerStateIncomplete reports that rebuilding producer state could not
// read a segment: duplicates of the batches it holds may then be accepted
// again.
func (p *partition) producerStateIncomplete(s *segment, err error) {
	p.set.logger.Error("producer state rebuilt without a segment it could not read; retried batches from it may be duplicated",
		"topic", p.topic, "partition", p.id, "segment", s.base, "err", err)
}

// cutTornLocked cuts a failed append's bytes (torn) from the end of the
// active segment.
func (p *partition) cutTornLocked() error {
	if p.torn == nil {
		return nil
	}
	s := p.segs[len(p.segs)-1]
	if err := s.log.Truncate(s.size); err != nil {
		return storageErr("cut a failed write from the segment", err)
	}
	p.torn = nil
	return nil
}

// resetPoint is where a generation ended: at durable, after cause.
type resetPoint struct {
	durable int64
	cause   error
}

// outcome is the end of a wait for target in the generation that ended
// here: nil when it was durable by then, else the storage error.
func (r resetPoint) outcome(target int64) error {
	if target <= r.durable {
		return nil
	}
	if r.cause == nil {
		return storageErr("append", errors.New("rolled back to the durable state"))
	}
	return storageErr("append rolled back", r.cause)
}

// resetLocked returns the partition to its durable state after cause: it
// truncates the active segment back to the last durable position and
// rebuilds index and producer state from disk.
func (p *partition) resetLocked(cause error) error {
	s := p.segs[len(p.segs)-1]
	if err := s.log.Truncate(p.durablePos); err != nil {
		p.broken = err
		return storageErr("truncate to durable position", err)
	}
	// The cut must be durable before other data takes those offsets: a
	// crash must not bring back a rolled-back batch in their place.
	if err := p.set.health.sync(s.log, "fsync truncated segment"); err != nil {
		p.broken = err
		return err
	}
	p.torn = nil
	p.resetPoints = append(p.resetPoints, resetPoint{durable: p.durable, cause: cause})
	p.gen++
	cands, err := p.recoverActiveLocked(true, nil)
	if err != nil {
		p.broken = err
		return err
	}
	p.candidates = cands
	p.settleDamageLocked()
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
