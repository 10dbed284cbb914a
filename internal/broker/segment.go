package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const (
	logSuffix       = ".log"
	indexSuffix     = ".index"
	timeIndexSuffix = ".timeindex"
	snapshotSuffix  = ".snapshot"
	cleanedSuffix   = ".cleaned"
	cutInfix        = ".cut-"
	offsetEntrySize = 8
	timeEntrySize   = 12
)

func segmentName(dir string, base int64, suffix string) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", base, suffix))
}

// offsetEntry maps an offset (relative to the segment base) to the file
// position of the batch containing it.
type offsetEntry struct {
	rel uint32
	pos uint32
}

// timeEntry records that batches at or after rel carry timestamps >= ts.
type timeEntry struct {
	ts  int64
	rel uint32
}

// segment is one log file and its two sparse indexes. Fields are guarded by
// the owning partition's mutex except where noted.
type segment struct {
	dir  string
	base int64
	// size is the byte length of the complete batches in the file.
	size int64
	// maxTS is the largest batch max timestamp in the segment (-1 if empty).
	maxTS int64
	// created is when the first batch was appended (unix ms), used by
	// segment.ms rolling; 0 while empty.
	created int64

	log      File // nil while an inactive segment is not open
	idxFile  File // open for the active segment only
	timeFile File

	// Sparse indexes. The active segment keeps them in memory; an inactive
	// segment loads them on first use and drops them on eviction.
	idx           []offsetEntry
	tidx          []timeEntry
	loaded        bool
	bytesSinceIdx int

	// damaged are spans of bytes reported lost and kept in place, sorted
	// by position; reads and scans hop over them.
	damaged []span

	// last is the header of the segment's last batch noted (appended or
	// scanned), at lastPos; hasLast says there is one.
	last    BatchHeader
	lastPos int64
	hasLast bool
	// Recovery point (recoverypoint.go), active segment only: rpIdx and
	// rpTidx index entries are in the recovery file, which holds nothing
	// else when rpStale is false; rpNext is the next offset of its last
	// frame (-1: none); rpGen counts rebuilds of the in-memory state, so a
	// point captured before one is not written after it.
	rpIdx, rpTidx int
	rpStale       bool
	rpNext        int64
	rpGen         int
	// rpSnap is the producer state the recovery point held, until the
	// partition's producer state is rebuilt from it.
	rpSnap []byte

	refs    int  // fetches currently reading the file
	deleted bool // removed by retention, replaced by compaction, or its partition closed while pinned
	lastUse uint64
}

// scanBatches walks the batches of a log file from pos up to limit, calling
// fn for each one that parses (and passes the CRC check when verify is set).
// It returns the position just after the last good batch and the reason it
// stopped early, if any (nil when it reached limit cleanly).
func scanBatches(f File, pos, limit int64, verify bool, fn func(h BatchHeader, pos int64, b []byte) error) (int64, error) {
	return scanBatchesSkip(f, pos, limit, verify, nil, fn)
}

// scanBatchesSkip is scanBatches hopping over the damaged spans in skip
// (bytes of a batch reported lost, kept in place; see lost.go).
func scanBatchesSkip(f File, pos, limit int64, verify bool, skip []span, fn func(h BatchHeader, pos int64, b []byte) error) (int64, error) {
	var hdr [BatchHeaderSize]byte
	var buf []byte
	for pos < limit {
		if n := skipAt(skip, pos); n > 0 {
			pos += n
			continue
		}
		if limit-pos < BatchHeaderSize {
			return pos, fmt.Errorf("%w: %d trailing bytes shorter than a header", ErrCorruptBatch, limit-pos)
		}
		if _, err := f.ReadAt(hdr[:], pos); err != nil {
			return pos, fmt.Errorf("read header at %d: %w", pos, err)
		}
		h, err := ParseBatchHeader(hdr[:])
		if err != nil {
			return pos, err
		}
		if int64(h.Size()) > limit-pos {
			return pos, fmt.Errorf("%w: batch of %d bytes at %d runs past end %d", ErrCorruptBatch, h.Size(), pos, limit)
		}
		var b []byte
		if verify {
			if cap(buf) < h.Size() {
				buf = make([]byte, h.Size())
			}
			b = buf[:h.Size()]
			if _, err := f.ReadAt(b, pos); err != nil {
				return pos, fmt.Errorf("read batch at %d: %w", pos, err)
			}
			if _, err := VerifyBatch(b); err != nil {
				return pos, err
			}
		}
		if err := fn(h, pos, b); err != nil {
			return pos, err
		}
		pos += int64(h.Size())
	}
	return pos, nil
}

// indexBuilder accumulates sparse index entries while batches are appended
// or scanned, adding an entry every interval bytes.
func (s *segment) noteBatch(h BatchHeader, pos int64, interval int) (offsetEntry, *timeEntry, bool) {
	if s.created == 0 {
		s.created = h.MaxTimestamp
	}
	s.last, s.lastPos, s.hasLast = h, pos, true
	first := len(s.idx) == 0
	s.bytesSinceIdx += h.Size()
	var te *timeEntry
	newMax := h.MaxTimestamp > s.maxTS
	if newMax {
		s.maxTS = h.MaxTimestamp
	}
	if !first && s.bytesSinceIdx < interval {
		return offsetEntry{}, nil, false
	}
	s.bytesSinceIdx = 0
	oe := offsetEntry{rel: uint32(h.BaseOffset - s.base), pos: uint32(pos)}
	s.idx = append(s.idx, oe)
	if len(s.tidx) == 0 || s.maxTS > s.tidx[len(s.tidx)-1].ts {
		s.tidx = append(s.tidx, timeEntry{ts: s.maxTS, rel: oe.rel})
		te = &s.tidx[len(s.tidx)-1]
	}
	return oe, te, true
}

func encodeOffsetEntry(e offsetEntry) []byte {
	var b [offsetEntrySize]byte
	binary.BigEndian.PutUint32(b[0:], e.rel)
	binary.BigEndian.PutUint32(b[4:], e.pos)
	return b[:]
}

func encodeTimeEntry(e timeEntry) []byte {
	var b [timeEntrySize]byte
	binary.BigEndian.PutUint64(b[0:], uint64(e.ts))
	binary.BigEndian.PutUint32(b[8:], e.rel)
	return b[:]
}

// lookup returns the file position from which to scan for offset, and the
// base offset of the batch there.
func (s *segment) lookup(offset int64) (int64, int64) {
	rel := offset - s.base
	i := sort.Search(len(s.idx), func(i int) bool { return int64(s.idx[i].rel) > rel })
	if i == 0 {
		return 0, s.base
	}
	return int64(s.idx[i-1].pos), s.base + int64(s.idx[i-1].rel)
}

// lookupTime returns the file position from which to scan for the first
// batch with max timestamp >= ts.
func (s *segment) lookupTime(ts int64) int64 {
	i := sort.Search(len(s.tidx), func(i int) bool { return s.tidx[i].ts >= ts })
	if i == 0 {
		return 0
	}
	pos, _ := s.lookup(s.base + int64(s.tidx[i-1].rel))
	return pos
}

// loadIndexes reads both index files of an inactive segment and checks them
// against the log size. It reports false when they are missing or damaged,
// in which case the caller rebuilds them from the log.
func (s *segment) loadIndexes(fsys FS) bool {
	ib, err := readFile(fsys, segmentName(s.dir, s.base, indexSuffix))
	if err != nil || len(ib)%offsetEntrySize != 0 {
		return false
	}
	tb, err := readFile(fsys, segmentName(s.dir, s.base, timeIndexSuffix))
	if err != nil || len(tb)%timeEntrySize != 0 {
		return false
	}
	if (len(ib) == 0) != (s.size == 0) {
		return false
	}
	idx := make([]offsetEntry, 0, len(ib)/offsetEntrySize)
	for i := 0; i < len(ib); i += offsetEntrySize {
		e := offsetEntry{rel: binary.BigEndian.Uint32(ib[i:]), pos: binary.BigEndian.Uint32(ib[i+4:])}
		if int64(e.pos) >= s.size || (len(idx) > 0 && (e.pos <= idx[len(idx)-1].pos || e.rel < idx[len(idx)-1].rel)) {
			return false
		}
		idx = append(idx, e)
	}
	tidx := make([]timeEntry, 0, len(tb)/timeEntrySize)
	for i := 0; i < len(tb); i += timeEntrySize {
		e := timeEntry{ts: int64(binary.BigEndian.Uint64(tb[i:])), rel: binary.BigEndian.Uint32(tb[i+8:])}
		if len(tidx) > 0 && (e.ts <= tidx[len(tidx)-1].ts || e.rel < tidx[len(tidx)-1].rel) {
			return false
		}
		tidx = append(tidx, e)
	}
	s.idx, s.tidx, s.loaded = idx, tidx, true
	s.maxTS = -1
	if len(tidx) > 0 {
		s.maxTS = tidx[len(tidx)-1].ts
	}
	return true
}

// rebuildIndexes scans the log (headers only) and rewrites both index files.
func (s *segment) rebuildIndexes(fsys FS, f File, interval int, sync bool) error {
	s.idx, s.tidx, s.maxTS, s.bytesSinceIdx, s.created = nil, nil, -1, 0, 0
	var ib, tb []byte
	end, err := scanBatchesSkip(f, 0, s.size, false, s.damaged, func(h BatchHeader, pos int64, _ []byte) error {
		oe, te, ok := s.noteBatch(h, pos, interval)
		if ok {
			ib = append(ib, encodeOffsetEntry(oe)...)
			if te != nil {
				tb = append(tb, encodeTimeEntry(*te)...)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild index of %s: %w", segmentName(s.dir, s.base, logSuffix), err)
	}
	s.size = end
	s.loaded = true
	if err := writeWholeFile(fsys, segmentName(s.dir, s.base, indexSuffix), ib, sync); err != nil {
		return err
	}
	return writeWholeFile(fsys, segmentName(s.dir, s.base, timeIndexSuffix), tb, sync)
}

func writeWholeFile(fsys FS, path string, data []byte, sync bool) error {
	f, err := fsys.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return storageErr("create "+path, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return storageErr("write "+path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return storageErr("fsync "+path, err)
		}
	}
	return storageErr("close "+path, f.Close())
}

// closeFiles closes whatever handles the segment holds.
func (s *segment) closeFiles() error {
	var errs []error
	for _, f := range []*File{&s.log, &s.idxFile, &s.timeFile} {
		if *f != nil {
			errs = append(errs, (*f).Close())
			*f = nil
		}
	}
	return errors.Join(errs...)
}

// removeFiles deletes the segment's files from disk.
func (s *segment) removeFiles(fsys FS) error {
	var errs []error
	for _, suf := range []string{logSuffix, indexSuffix, timeIndexSuffix, recoverySuffix} {
		if err := fsys.Remove(segmentName(s.dir, s.base, suf)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// listSegmentBases returns the base offsets of the .log files in dir,
// ascending, removing leftovers of interrupted index or compaction writes.
func listSegmentBases(fsys FS, dir string, cleanup bool) ([]int64, []int64, error) {
	bases, snaps, _, err := listPartitionDir(fsys, dir, cleanup)
	return bases, snaps, err
}

// listPartitionDir is listSegmentBases that also returns the set of the
// directory's other file names (recovery points among them), so that an
// open reads lost.json, log-start and the active segment's recovery point
// only when they are there: failed opens per partition were a visible
// share of opening thousands of them. cleanup removes the leftovers
// (partitionListing.leftovers).
func listPartitionDir(fsys FS, dir string, cleanup bool) ([]int64, []int64, map[string]bool, error) {
	l, err := readPartitionDir(fsys, dir)
	if err != nil {
		return nil, nil, nil, err
	}
	if cleanup {
		for _, name := range l.leftovers {
			_ = fsys.Remove(filepath.Join(dir, name))
		}
	}
	return l.bases, l.snaps, l.others, nil
}

// partitionListing is what a partition directory holds.
type partitionListing struct {
	bases, snaps []int64 // segments and snapshots, ascending
	// others are lost.json, log-start and the recovery files there.
	others map[string]bool
	// leftovers are files an open removes: those of interrupted index
	// or compaction writes (.tmp, .cleaned), and recovery points of
	// segments no longer active (only the active one's is used). They
	// are not in bases, snaps or others.
	leftovers []string
}

func readPartitionDir(fsys FS, dir string) (partitionListing, error) {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		return partitionListing{}, err
	}
	l := partitionListing{others: map[string]bool{}}
	var recs []int64
	for _, e := range entries {
		name := e.Name()
		if name == lostFile || name == logStartFile {
			l.others[name] = true
		}
		if n, err := strconv.ParseInt(strings.TrimSuffix(name, recoverySuffix), 10, 64); err == nil && strings.HasSuffix(name, recoverySuffix) {
			recs = append(recs, n)
			l.others[name] = true
		}
		if strings.HasSuffix(name, cleanedSuffix) || strings.HasSuffix(name, ".tmp") {
			l.leftovers = append(l.leftovers, name)
			continue
		}
		for _, suf := range []string{logSuffix, snapshotSuffix} {
			if !strings.HasSuffix(name, suf) {
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSuffix(name, suf), 10, 64)
			if err != nil || n < 0 {
				continue
			}
			if suf == logSuffix {
				l.bases = append(l.bases, n)
			} else {
				l.snaps = append(l.snaps, n)
			}
		}
	}
	sort.Slice(l.bases, func(i, j int) bool { return l.bases[i] < l.bases[j] })
	sort.Slice(l.snaps, func(i, j int) bool { return l.snaps[i] < l.snaps[j] })
	for _, n := range recs {
		if len(l.bases) == 0 || n != l.bases[len(l.bases)-1] {
			name := segmentName("", n, recoverySuffix)
			delete(l.others, name)
			l.leftovers = append(l.leftovers, name)
		}
	}
	return l, nil
}

// fileSize returns the size of an open file.
func fileSize(f File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// copyRange copies [from, to) of src into a new file at path, used to keep
// cut tail bytes aside before truncating them.
func copyRange(fsys FS, src File, from, to int64, path string) error {
	dst, err := fsys.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, io.NewSectionReader(src, from, to-from))
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	return err
}
