package broker

import (
	"errors"
	"fmt"
	"time"
)

// lockForSync takes syncMu, then mu, in the lock order, for a caller that
// fsyncs; unlockSync releases both.
func (p *partition) lockForSync() {
	p.syncMu.Lock()
	p.mu.Lock()
}

func (p *partition) unlockSync() {
	p.mu.Unlock()
	p.syncMu.Unlock()
}

// waitDurable returns once offsets below target are fsynced, fsyncing
// itself if no one else has. Appenders queue on syncMu while one fsync runs;
// the next one in line usually finds its data already covered.
func (p *partition) waitDurable(target int64, gen int) error {
	if j := p.set.journal; j != nil {
		return p.waitJournal(j, target, gen)
	}
	p.lockForSync()
	defer p.unlockSync()
	for {
		if p.closed {
			if target <= p.durable {
				return nil
			}
			return ErrClosed
		}
		if gen != p.gen {
			return p.resetPoints[gen].outcome(target)
		}
		if target <= p.durable {
			return nil
		}
		if err := p.set.health.check(); err != nil {
			return err
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
			if done && err == nil {
				return nil
			}
			// Rolled back or not durable: the sync's error says why.
			return serr
		}
	}
}

// durableLocked says whether a wait for target, written in generation gen,
// is over, and how it ended.
func (p *partition) durableLocked(target int64, gen int) (bool, error) {
	if gen != p.gen {
		return true, p.resetPoints[gen].outcome(target)
	}
	if target <= p.durable {
		return true, nil
	}
	if err := p.set.health.check(); err != nil {
		return true, err
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
// journal write, unless that already happened (gen moved on).
func (p *partition) rollBack(gen int, cause error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.gen != gen {
		return
	}
	if err := p.resetLocked(cause); err != nil {
		p.set.logger.Error("rolling back after a failed journal write", "topic", p.topic, "partition", p.id, "err", err)
	}
}

// syncSegment fsyncs the active segment, whatever the journal already made
// durable: a journal checkpoint does this before deleting journal files.
func (p *partition) syncSegment() error {
	// syncMu keeps Close out until the fsyncs are done: Close closes the
	// files, and the broker closes its partitions before it stops the
	// checkpoint.
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	if !p.lockOpen() {
		return nil
	}
	s := p.segs[len(p.segs)-1]
	st, ok := p.recoveryStateLocked(s)
	gen := s.rpGen
	p.pinLocked(s)
	p.mu.Unlock()
	defer p.unpin(s)
	if err := p.syncDirIfDirty(); err != nil {
		return err
	}
	if err := p.set.health.sync(s.log, "fsync segment"); err != nil {
		return err
	}
	if ok {
		p.mu.Lock()
		if !p.closed && s == p.segs[len(p.segs)-1] && s.rpGen == gen && p.broken == nil && p.torn == nil {
			p.writeRecoveryLocked(s, st)
		}
		p.mu.Unlock()
	}
	return nil
}

// activeBase is the base offset of the active segment.
func (p *partition) activeBase() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.segs[len(p.segs)-1].base
}

// rewindTo cuts the active segment back to the batch starting at offset,
// which the journal holds with everything after it, so that replaying the
// journal rewrites that range (see replayJournals). When the range holds
// damaged bytes they are first kept in a side file, as a cut tail is.
// Without a batch starting at offset in the active segment it does
// nothing. Used while the broker opens.
func (p *partition) rewindTo(offset int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.segs[len(p.segs)-1]
	if s.rpNext > offset {
		// An fsync of the segment covered everything before the recovery
		// point: only what follows it is rewritten.
		offset = s.rpNext
	}
	if offset >= p.next || offset < s.base {
		return nil
	}
	pos, _ := s.lookup(offset)
	found := false
	for pos < s.size {
		if n := skipAt(s.damaged, pos); n > 0 {
			pos += n
			continue
		}
		var hdr [BatchHeaderSize]byte
		if _, err := s.log.ReadAt(hdr[:], pos); err != nil {
			return storageErr("read active segment", err)
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil || h.BaseOffset > offset {
			break
		}
		if h.BaseOffset == offset {
			found = true
			break
		}
		pos += int64(h.Size())
	}
	if !found {
		return nil
	}
	damaged := false
	for _, d := range s.damaged {
		damaged = damaged || d.pos >= pos
	}
	if damaged {
		cut := segmentName(p.dir, s.base, fmt.Sprintf("%s%s%d", logSuffix, cutInfix, time.Now().UnixNano()))
		p.set.logger.Warn("rewriting damaged batches from the journal", "topic", p.topic, "partition", p.id,
			"segment", s.base, "from_offset", offset, "damaged_bytes_kept_in", cut)
		if err := copyRange(p.set.fs, s.log, pos, s.size, cut); err != nil {
			return storageErr("save damaged range", err)
		}
	}
	if err := s.log.Truncate(pos); err != nil {
		return storageErr("truncate for journal replay", err)
	}
	// Losses recorded in the rewritten range are open again: the replay
	// may restore them (settleDamageLocked decides).
	kept := p.lost[:0]
	for _, r := range p.lost {
		if r.Segment == s.base && r.Pos >= pos {
			r.Segment, r.Pos, r.Size = -1, 0, 0
			p.candidates = append(p.candidates, r)
			continue
		}
		kept = append(kept, r)
	}
	if len(kept) < len(p.lost) {
		p.lost = kept
		if err := p.saveLostLocked(); err != nil {
			return err
		}
	}
	cands, err := p.recoverActiveLocked(true, nil)
	if err != nil {
		return err
	}
	p.candidates = append(p.candidates, cands...)
	// Producer state as of the cut; the replay adds the batches again.
	_, snaps, err := listSegmentBases(p.set.fs, p.dir, false)
	if err != nil {
		return storageErr("list snapshots", err)
	}
	p.rebuildProducersLocked(snaps)
	return nil
}

// replay appends a batch read back from the journal when it continues the
// log; a batch the log holds already is skipped. A batch beyond the log
// end is appended too, after reporting the offsets in between as lost:
// they were acknowledged (the journal holds later ones) and neither the
// segment nor the journal has them. Used while the broker opens, before
// anything reads the partition.
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
	case h.BaseOffset < p.next:
		p.set.logger.Error("the journal holds a batch that overlaps the log end", "topic", p.topic, "partition", p.id,
			"batch_offset", h.BaseOffset, "log_end", p.next)
		return false, nil
	case h.BaseOffset > p.next:
		p.recordLostLocked(LostRange{First: p.next, Last: h.BaseOffset - 1, Segment: -1,
			Reason: "missing from both the segment and the journal, found while replaying the journal"})
		p.next = h.BaseOffset
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
	err := p.syncDirIfDirty()
	if err == nil {
		err = p.set.health.sync(s.log, "fsync segment")
	}
	p.mu.Lock()
	if err != nil {
		return err
	}
	if gen != p.gen {
		return nil
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
func (p *partition) sync() error { return p.whileOpen(p.syncLocked) }
