package broker

import (
	"os"
	"time"
)

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
	if err := p.set.health.check(); err != nil {
		return AppendResult{}, -1, 0, err
	}
	if err := p.cutTornLocked(); err != nil {
		return AppendResult{}, -1, 0, err
	}
	if p.broken != nil {
		if err := p.resetLocked(p.broken); err != nil {
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
		return AppendResult{BaseOffset: dup.FirstOffset, LogStartOffset: p.logStartLocked(), Duplicate: true}, target, p.gen, nil
	}
	h.BaseOffset = p.next
	active, err := p.appendLocked(batch, h, p.set.journal)
	if err != nil {
		return AppendResult{}, -1, 0, err
	}
	res = AppendResult{BaseOffset: h.BaseOffset, LogStartOffset: p.logStartLocked()}
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
		// append cuts it first. Never back to the last fsync: the batches
		// since are in the journal, and a batch that took their offsets
		// would lose to them in a replay.
		if terr := active.log.Truncate(active.size); terr != nil {
			p.torn = terr
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
	marker := int16(-1)
	if h.Control() {
		marker = controlType(batch)
	}
	p.txns.note(h, marker)
	p.next = h.LastOffset() + 1
	p.appended += int64(len(batch))
	return active, nil
}

func (p *partition) needsRollLocked(s *segment, h BatchHeader, now time.Time) bool {
	if s.size == 0 {
		return false
	}
	cfg := p.set.config()
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
	if err := p.set.health.sync(old.log, "fsync segment before roll"); err != nil {
		return err
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
	if err := p.set.health.syncDir(fsys, p.dir, "fsync partition dir"); err != nil {
		_ = f.Close()
		return err
	}
	p.dirDirty.Store(false)
	old.idx, old.tidx, old.loaded = nil, nil, false
	old.lastUse = p.tick()
	// Its recovery point is of no use once the segment is inactive.
	_ = fsys.Remove(segmentName(p.dir, old.base, recoverySuffix))
	ns := &segment{dir: p.dir, base: p.next, maxTS: -1, log: f, loaded: true, rpStale: true, rpNext: -1}
	p.segs = append(append([]*segment(nil), p.segs...), ns)
	p.durablePos, p.hwPos = 0, 0
	p.notifyLocked()
	if err := writeSnapshot(fsys, p.dir, p.next, p.producers, p.txns); err != nil {
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
