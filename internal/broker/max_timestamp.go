package broker

// MaxTimestamp returns the offset and timestamp of the record with the
// largest timestamp below the high watermark, the first such record when
// several share it (ListOffsets' max-timestamp query, KIP-734); -1, -1
// when the partition holds none. Control records (transaction markers)
// count as Kafka counts them: their batches carry a timestamp too.
func (b *Broker) MaxTimestamp(topicName string, part int32) (offset, timestamp int64, err error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return 0, 0, err
	}
	return p.maxTimestamp()
}

// maxTimestamp finds the segment holding the largest timestamp from the
// segments' maxima and reads only from its time index entry on. The active
// segment's maximum may come from a batch not yet below the high
// watermark: then that segment is read whole up to it, and an older
// segment answers if it holds a larger timestamp.
func (p *partition) maxTimestamp() (int64, int64, error) {
	if !p.lockOpen() {
		return 0, 0, ErrClosed
	}
	var older *segment
	for _, s := range p.segs[:len(p.segs)-1] {
		if s.size > 0 && (older == nil || s.maxTS > older.maxTS) {
			older = s
		}
	}
	active, activeLimit := p.segs[len(p.segs)-1], p.hwPos
	if activeLimit > 0 && (older == nil || active.maxTS > older.maxTS) {
		if err := p.ensureOpenLocked(active); err != nil {
			p.mu.Unlock()
			return 0, 0, err
		}
		from, target, skip := active.lookupTime(active.maxTS), active.maxTS, active.damaged
		p.pinLocked(active)
		p.mu.Unlock()
		ts, off, err := scanMaxTimestamp(active.log, skip, from, activeLimit)
		if err == nil && ts != target {
			ts, off, err = scanMaxTimestamp(active.log, skip, 0, activeLimit)
		}
		p.unpin(active)
		if err != nil || older == nil || ts > older.maxTS {
			return off, ts, err
		}
		if !p.lockOpen() {
			return 0, 0, ErrClosed
		}
	}
	if older == nil || older.deleted {
		p.mu.Unlock()
		return -1, -1, nil
	}
	if err := p.ensureOpenLocked(older); err != nil {
		p.mu.Unlock()
		return 0, 0, err
	}
	from, limit, skip := older.lookupTime(older.maxTS), older.size, older.damaged
	p.pinLocked(older)
	p.mu.Unlock()
	defer p.unpin(older)
	ts, off, err := scanMaxTimestamp(older.log, skip, from, limit)
	return off, ts, err
}

// scanMaxTimestamp reads a segment's batches in [from, limit), hopping
// over its damaged spans, and returns the largest record timestamp and the
// first offset holding it (-1, -1: no batch). Only batches that raise the
// maximum are decoded.
func scanMaxTimestamp(f File, skip []span, from, limit int64) (ts, offset int64, err error) {
	ts, offset = -1, -1
	_, err = scanBatchesSkip(f, from, limit, true, skip, func(h BatchHeader, _ int64, b []byte) error {
		if h.MaxTimestamp <= ts {
			return nil
		}
		recs, err := decodeRecords(h, b, maxDecompressedSize)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if t := r.Timestamp.UnixMilli(); t > ts {
				ts, offset = t, r.Offset
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, storageErr("scan for the largest timestamp", err)
	}
	return ts, offset, nil
}
