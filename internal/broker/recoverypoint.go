package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"time"
)

// A recovery point says how much of the active segment is known durable
// and sound, so that an open after a crash scans only the bytes after it
// (Kafka's recovery-point-offset-checkpoint). It is kept per active
// segment, in NNN.recovery beside NNN.log, as an append-only list of
// frames, each written and fsynced after an fsync of the segment that
// covered everything it describes (the journal checkpoint, Close):
//
//	uint32 payload length | uint32 CRC32C of payload | payload:
//	uint16 version (1) | int64 segment base | int64 next offset |
//	int64 position | int64 position of the last batch | int64 its base
//	offset | uint32 its CRC | int64 segment max timestamp | int64 created |
//	uint32 bytes since the last index entry |
//	uint32 index entries before | uint32 n | n × (uint32 rel, uint32 pos) |
//	uint32 time index entries before | uint32 m | m × (int64 ts, uint32 rel) |
//	uint32 k | k bytes: the producer state snapshot at the next offset
//	(the .snapshot format, see Producer state in doc.go)
//
// The frames carry the in-memory index of the active segment as it grew
// (each frame only its new entries), and the producer state, so the open
// rebuilds both without reading the log before the point. The last sound frame wins; a frame whose counts do not
// continue the ones before it, of another segment, or damaged, ends the
// file. The point is used only after a check: the position is within the
// file, the index entries lie below it, and the batch that ends at the
// position is read whole, passes its CRC and has the recorded base offset,
// CRC and last offset. Otherwise the whole active segment is scanned, as
// without a recovery point.
const (
	recoverySuffix  = ".recovery"
	recoveryVersion = 1
	recoveryFixed   = 2 + 8*5 + 4 + 8*2 + 4
)

// recoveryState is the state of an active segment at a recovery point.
type recoveryState struct {
	next, pos         int64
	lastPos, lastBase int64
	lastCRC           uint32
	maxTS, created    int64
	sinceIdx          int
	nIdx, nTidx       int
	// snap is the encoded producer state as of next.
	snap []byte
	// last is the header of the batch before the point, read by the
	// check that a loaded point passed (not written).
	last BatchHeader
}

// recoveryStateLocked captures the state of p's active segment s at its
// end, for a recovery point once an fsync covered it. ok is false when
// there is nothing to record or the segment does not end in a whole batch
// the broker can check.
func (p *partition) recoveryStateLocked(s *segment) (recoveryState, bool) {
	if s.size == 0 || !s.hasLast || s.lastPos+int64(s.last.Size()) != s.size {
		return recoveryState{}, false
	}
	next := s.last.LastOffset() + 1
	return recoveryState{next: next, pos: s.size, lastPos: s.lastPos, lastBase: s.last.BaseOffset,
		lastCRC: s.last.CRC, maxTS: s.maxTS, created: s.created, sinceIdx: s.bytesSinceIdx,
		nIdx: len(s.idx), nTidx: len(s.tidx), snap: encodeSnapshot(next, p.producers, p.txns)}, true
}

// writeRecoveryLocked appends a frame for st to s's recovery file (or
// rewrites the file when it is stale) and fsyncs it. Called with p.mu held,
// after an fsync of the segment that covered st, and only while s is the
// active segment of the generation st was taken in. A failure is not a
// storage failure of the broker: the recovery point is an optimisation, so
// the file is marked stale (rewritten whole next time) and the next open
// scans more. It reports whether the frame is durable.
func (p *partition) writeRecoveryLocked(s *segment, st recoveryState) bool {
	from, tfrom := s.rpIdx, s.rpTidx
	flag := os.O_CREATE | os.O_WRONLY | os.O_APPEND
	if s.rpStale || from > st.nIdx || tfrom > st.nTidx {
		from, tfrom = 0, 0
		flag = os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	}
	n := recoveryFixed + 8 + (st.nIdx-from)*offsetEntrySize + 8 + (st.nTidx-tfrom)*timeEntrySize + 4 + len(st.snap)
	b := make([]byte, 8, 8+n)
	b = binary.BigEndian.AppendUint16(b, recoveryVersion)
	for _, v := range []int64{s.base, st.next, st.pos, st.lastPos, st.lastBase} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	b = binary.BigEndian.AppendUint32(b, st.lastCRC)
	b = binary.BigEndian.AppendUint64(b, uint64(st.maxTS))
	b = binary.BigEndian.AppendUint64(b, uint64(st.created))
	b = binary.BigEndian.AppendUint32(b, uint32(st.sinceIdx))
	b = binary.BigEndian.AppendUint32(b, uint32(from))
	b = binary.BigEndian.AppendUint32(b, uint32(st.nIdx-from))
	for _, e := range s.idx[from:st.nIdx] {
		b = append(b, encodeOffsetEntry(e)...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(tfrom))
	b = binary.BigEndian.AppendUint32(b, uint32(st.nTidx-tfrom))
	for _, e := range s.tidx[tfrom:st.nTidx] {
		b = append(b, encodeTimeEntry(e)...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(st.snap)))
	b = append(b, st.snap...)
	binary.BigEndian.PutUint32(b[0:], uint32(len(b)-8))
	binary.BigEndian.PutUint32(b[4:], crc32.Checksum(b[8:], castagnoli))
	if err := writeRecoveryFrame(p.set.fs, p.set.health, segmentName(p.dir, s.base, recoverySuffix), flag, b); err != nil {
		s.rpStale = true
		p.set.logger.Warn("writing the recovery point failed; the next open after a crash scans more of the active segment",
			"topic", p.topic, "partition", p.id, "segment", s.base, "err", err)
		return false
	}
	s.rpIdx, s.rpTidx, s.rpStale, s.rpNext = st.nIdx, st.nTidx, false, st.next
	return true
}

func writeRecoveryFrame(fsys FS, h *health, path string, flag int, frame []byte) error {
	f, err := fsys.OpenFile(path, flag, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(frame); err != nil {
		_ = f.Close()
		return err
	}
	start := time.Now()
	err = f.Sync()
	h.fsyncs.observe(fsyncFile("fsync recovery point"), time.Since(start), "fsync recovery point", h.logger)
	if err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// errNoRecoveryPoint is loadRecoveryPoint's answer for a missing file,
// which is normal (a new segment, or never checkpointed).
var errNoRecoveryPoint = errors.New("no recovery point")

// loadRecoveryPoint reads s's recovery file and checks its last sound
// frame against the log file f of size bytes (see the comment at the top).
// clean is false when the file holds more than its sound frames, so the
// next write rewrites it. listed false says the file is known not to
// exist, and it is not looked for; cached not nil is its content, read
// before (the clean-close manifest's copy), and it is not read again.
func loadRecoveryPoint(fsys FS, s *segment, f File, size int64, listed bool, cached []byte) (st recoveryState, idx []offsetEntry, tidx []timeEntry, clean bool, err error) {
	if !listed {
		return st, nil, nil, false, errNoRecoveryPoint
	}
	b, err := cached, error(nil)
	if b == nil {
		b, err = readFile(fsys, segmentName(s.dir, s.base, recoverySuffix))
	}
	if errors.Is(err, os.ErrNotExist) {
		return st, nil, nil, false, errNoRecoveryPoint
	}
	if err != nil {
		return st, nil, nil, false, err
	}
	found := false
	for len(b) > 0 {
		fr, rest, ok := nextRecoveryFrame(b)
		if !ok {
			break
		}
		next, nidx, ntidx, ok := parseRecoveryFrame(fr, s.base, idx, tidx)
		if !ok {
			break
		}
		st, idx, tidx, found, b = next, nidx, ntidx, true, rest
	}
	if !found {
		return st, nil, nil, false, errors.New("no sound frame in the recovery file")
	}
	clean = len(b) == 0
	if st.last, err = checkRecoveryPoint(f, size, st, idx, tidx); err != nil {
		return st, nil, nil, false, err
	}
	return st, idx, tidx, clean, nil
}

func nextRecoveryFrame(b []byte) (frame, rest []byte, ok bool) {
	if len(b) < 8 {
		return nil, nil, false
	}
	n := int64(binary.BigEndian.Uint32(b))
	if n < recoveryFixed+20 || int64(len(b)-8) < n {
		return nil, nil, false
	}
	fr := b[8 : 8+n]
	if crc32.Checksum(fr, castagnoli) != binary.BigEndian.Uint32(b[4:]) {
		return nil, nil, false
	}
	return fr, b[8+n:], true
}

// parseRecoveryFrame decodes one frame continuing the index entries idx and
// tidx read so far.
func parseRecoveryFrame(fr []byte, base int64, idx []offsetEntry, tidx []timeEntry) (recoveryState, []offsetEntry, []timeEntry, bool) {
	var st recoveryState
	be := binary.BigEndian
	if be.Uint16(fr) != recoveryVersion || int64(be.Uint64(fr[2:])) != base {
		return st, nil, nil, false
	}
	st.next, st.pos = int64(be.Uint64(fr[10:])), int64(be.Uint64(fr[18:]))
	st.lastPos, st.lastBase = int64(be.Uint64(fr[26:])), int64(be.Uint64(fr[34:]))
	st.lastCRC = be.Uint32(fr[42:])
	st.maxTS, st.created = int64(be.Uint64(fr[46:])), int64(be.Uint64(fr[54:]))
	st.sinceIdx = int(be.Uint32(fr[62:]))
	r := fr[recoveryFixed:]
	idx, r, ok := readIndexTail(r, idx, offsetEntrySize, 8, func(b []byte) offsetEntry {
		return offsetEntry{rel: be.Uint32(b), pos: be.Uint32(b[4:])}
	})
	if !ok {
		return st, nil, nil, false
	}
	tidx, r, ok = readIndexTail(r, tidx, timeEntrySize, 4, func(b []byte) timeEntry {
		return timeEntry{ts: int64(be.Uint64(b)), rel: be.Uint32(b[8:])}
	})
	if !ok {
		return st, nil, nil, false
	}
	if k := int(be.Uint32(r)); len(r) != 4+k {
		return st, nil, nil, false
	}
	st.snap = r[4:]
	st.nIdx, st.nTidx = len(idx), len(tidx)
	return st, idx, tidx, true
}

// readIndexTail reads one index section of a recovery point from r: the
// length the index had (which must be len(have)), the count n of entries
// added since, then the n entries of size bytes each, which after more
// bytes must follow. It returns have with the entries appended (in a new
// array) and the rest of r; ok is false for a section that does not fit.
func readIndexTail[E any](r []byte, have []E, size, after int, entry func([]byte) E) (_ []E, rest []byte, ok bool) {
	if int(binary.BigEndian.Uint32(r)) != len(have) {
		return nil, nil, false
	}
	n := int(binary.BigEndian.Uint32(r[4:]))
	r = r[8:]
	if len(r) < n*size+after {
		return nil, nil, false
	}
	all := append([]E(nil), have...)
	for i := 0; i < n; i++ {
		all = append(all, entry(r))
		r = r[size:]
	}
	return all, r, true
}

// checkRecoveryPoint checks a recovery point against the log it describes.
func checkRecoveryPoint(f File, size int64, st recoveryState, idx []offsetEntry, tidx []timeEntry) (BatchHeader, error) {
	if st.pos <= st.lastPos || st.lastPos < 0 || st.pos > size {
		return BatchHeader{}, fmt.Errorf("recovery point at %d, log of %d bytes", st.pos, size)
	}
	for i, e := range idx {
		if int64(e.pos) > st.lastPos || (i > 0 && (e.pos <= idx[i-1].pos || e.rel < idx[i-1].rel)) {
			return BatchHeader{}, errors.New("recovery point index entries out of order")
		}
	}
	for i, e := range tidx {
		if i > 0 && (e.ts <= tidx[i-1].ts || e.rel < tidx[i-1].rel) {
			return BatchHeader{}, errors.New("recovery point time index entries out of order")
		}
	}
	b := make([]byte, st.pos-st.lastPos)
	if _, err := f.ReadAt(b, st.lastPos); err != nil {
		return BatchHeader{}, fmt.Errorf("read the batch before the recovery point: %w", err)
	}
	h, err := VerifyBatch(b)
	if err != nil {
		return BatchHeader{}, fmt.Errorf("the batch before the recovery point: %w", err)
	}
	if h.Size() != len(b) || h.BaseOffset != st.lastBase || h.CRC != st.lastCRC || h.LastOffset()+1 != st.next {
		return BatchHeader{}, fmt.Errorf("the batch before the recovery point (offset %d, crc %08x) is not the one recorded (offset %d, crc %08x)",
			h.BaseOffset, h.CRC, st.lastBase, st.lastCRC)
	}
	return h, nil
}
