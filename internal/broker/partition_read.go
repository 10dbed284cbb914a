package broker

import (
	"errors"
	"fmt"
	"sort"
)

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
