package broker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
)

// A clean-close manifest (DIR/clean-close) spares the next open the two
// file reads per partition that a data directory of thousands of small
// partitions spends most of its open on: listing the partition directory
// and reading the active segment's recovery point. Close writes it, after
// every partition closed cleanly (segments fsynced, recovery points
// written) and the storage is healthy; Open reads it, then removes it
// durably before it opens any partition, so a manifest never outlives the
// open after the close that wrote it. For each partition it holds:
//
//   - the directory's identity at close: device, inode, modification and
//     change times (ns). A partition whose directory no longer has it (a
//     file added, removed or renamed there since, the directory removed or
//     replaced) is opened as without a manifest. The change time cannot be
//     set from user space: any entry change after the close moves it.
//   - what the listing found: segment bases, snapshot offsets, whether
//     lost.json, log-start and a recovery file are there. A partition
//     whose listing found leftovers an open removes (.tmp, .cleaned, a
//     recovery file of a segment no longer active) is left out.
//   - the recovery file's bytes, when small (cleanRecoveryMax). They are
//     checked against the segment exactly as the file's are (see Recovery
//     point): the manifest saves the read, not the check.
//
// File format: uint32 length | uint32 CRC32C | payload: uint16 version (1)
// | string log id | uint32 n | n × entry: string topic | int32 partition |
// uint64 dev | uint64 inode | int64 mtime | int64 ctime | uint8 flags (1
// lost.json, 2 log-start, 4 recovery file) | uint32 k | k × int64 base |
// uint32 m | m × int64 snapshot | uint32 r | r bytes of recovery file;
// strings are uint16 length | bytes.
//
// Fault model, and the tests that show it (cleanclose_test.go):
//   - Killed while Close writes it: it is written as meta.json is
//     (temporary file, fsync, rename, directory fsync), so an open finds
//     none, or a whole one; none means the full open.
//   - Killed or crashed after an open: the open removed it, and fsynced
//     the data directory, before any partition could change; a later open
//     cannot find a manifest older than the files.
//   - Damaged, truncated, of another data directory (log id), of another
//     version: ignored, with a warning, and removed; the open is the full
//     one. TestCleanCloseManifestDamaged.
//   - Operator edits while the broker is stopped: a file added to or
//     removed from a partition directory, the directory removed: its
//     identity differs, the partition is listed. A segment file edited in
//     place: the recovery point's check against the log, as without a
//     manifest. TestCleanCloseManifestOperatorEdits.
//   - Clock steps: the times are compared for equality, not order. A step
//     back that lands an edit on the exact nanosecond the close recorded
//     for that directory, within the coarse clock tick the kernel stamps
//     with, is the one case not caught.
//   - A file system without inode numbers or times (Stat without
//     syscall.Stat_t): no identity is recorded, every partition is listed.
const (
	cleanCloseFile    = "clean-close"
	cleanCloseVersion = 1
	// cleanRecoveryMax is the largest recovery file the manifest carries.
	// A longer one (an active segment of many index entries) is read from
	// its file; its open is dominated by other reads anyway.
	cleanRecoveryMax = 64 << 10

	cleanLost, cleanLogStart, cleanRecovery = 1, 2, 4
)

type partitionKey struct {
	topic string
	id    int32
}

// dirIdentity is what tells that a directory's entries have not changed.
type dirIdentity struct {
	dev, ino     uint64
	mtime, ctime int64
}

func identityOf(fi os.FileInfo) (dirIdentity, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return dirIdentity{}, false
	}
	return dirIdentity{dev: uint64(st.Dev), ino: st.Ino, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// cleanEntry is one partition's part of the manifest.
type cleanEntry struct {
	id           dirIdentity
	bases, snaps []int64
	flags        uint8
	recovery     []byte
}

// listing returns the entry as openPartition's listing of the directory,
// when dir still has the identity recorded.
func (e *cleanEntry) listing(fsys FS, dir string) (bases, snaps []int64, present map[string]bool, ok bool) {
	fi, err := fsys.Stat(dir)
	if err != nil || !fi.IsDir() {
		return nil, nil, nil, false
	}
	if id, ok := identityOf(fi); !ok || id != e.id {
		return nil, nil, nil, false
	}
	present = map[string]bool{}
	if e.flags&cleanLost != 0 {
		present[lostFile] = true
	}
	if e.flags&cleanLogStart != 0 {
		present[logStartFile] = true
	}
	if e.flags&cleanRecovery != 0 {
		present[segmentName("", e.bases[len(e.bases)-1], recoverySuffix)] = true
	}
	return e.bases, e.snaps, present, true
}

// cleanEntryOf builds the manifest entry of the closed partition in dir;
// ok is false for one the next open must list.
func cleanEntryOf(fsys FS, dir string) (cleanEntry, bool) {
	l, err := readPartitionDir(fsys, dir)
	if err != nil || len(l.bases) == 0 || len(l.leftovers) > 0 {
		return cleanEntry{}, false
	}
	e := cleanEntry{bases: l.bases, snaps: l.snaps}
	if l.others[lostFile] {
		e.flags |= cleanLost
	}
	if l.others[logStartFile] {
		e.flags |= cleanLogStart
	}
	if rec := segmentName(dir, l.bases[len(l.bases)-1], recoverySuffix); l.others[filepath.Base(rec)] {
		b, err := readFile(fsys, rec)
		if err != nil || len(b) > cleanRecoveryMax {
			return cleanEntry{}, false
		}
		e.flags |= cleanRecovery
		e.recovery = b
	}
	fi, err := fsys.Stat(dir)
	if err != nil {
		return cleanEntry{}, false
	}
	var ok bool
	e.id, ok = identityOf(fi)
	return e, ok
}

// writeCleanClose writes the manifest of parts, all closed cleanly. A
// failure only costs the next open its speed: it is logged.
func (b *Broker) writeCleanClose(parts []*partition, logID string) {
	entries := make([]cleanEntry, len(parts))
	ok := make([]bool, len(parts))
	parallel(len(parts), openParallelism, func(i int) error {
		entries[i], ok[i] = cleanEntryOf(b.opts.FS, parts[i].dir)
		return nil
	})
	var buf []byte
	buf = binary.BigEndian.AppendUint16(buf, cleanCloseVersion)
	buf = appendShortString(buf, logID)
	n := 0
	for _, k := range ok {
		if k {
			n++
		}
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	for i, p := range parts {
		if !ok[i] {
			continue
		}
		e := &entries[i]
		buf = appendShortString(buf, p.topic)
		buf = binary.BigEndian.AppendUint32(buf, uint32(p.id))
		buf = binary.BigEndian.AppendUint64(buf, e.id.dev)
		buf = binary.BigEndian.AppendUint64(buf, e.id.ino)
		buf = binary.BigEndian.AppendUint64(buf, uint64(e.id.mtime))
		buf = binary.BigEndian.AppendUint64(buf, uint64(e.id.ctime))
		buf = append(buf, e.flags)
		for _, list := range [][]int64{e.bases, e.snaps} {
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(list)))
			for _, v := range list {
				buf = binary.BigEndian.AppendUint64(buf, uint64(v))
			}
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(e.recovery)))
		buf = append(buf, e.recovery...)
	}
	file := make([]byte, 8, 8+len(buf))
	binary.BigEndian.PutUint32(file, uint32(len(buf)))
	binary.BigEndian.PutUint32(file[4:], crc32.Checksum(buf, castagnoli))
	file = append(file, buf...)
	if err := writeFileAtomic(b.opts.FS, filepath.Join(b.opts.Dir, cleanCloseFile), file); err != nil {
		b.opts.Logger.Warn("writing the clean-close manifest failed; the next open lists every partition", "err", err)
	}
}

func appendShortString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// takeCleanClose reads the manifest left by the last Close, if any, and
// removes it durably. A manifest that is unusable is reported and
// ignored; failing to remove it fails the open, since the files may change
// after it.
func takeCleanClose(fsys FS, dir, logID string, h *health, logger *slog.Logger) (map[partitionKey]*cleanEntry, error) {
	path := filepath.Join(dir, cleanCloseFile)
	_ = fsys.Remove(path + ".tmp")
	data, err := readFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var m map[partitionKey]*cleanEntry
	if err == nil {
		if m, err = parseCleanClose(data, logID); err != nil {
			logger.Warn("ignoring the clean-close manifest; every partition is listed", "reason", err)
		}
	}
	if err := fsys.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, storageErr("remove the clean-close manifest", err)
	}
	if err := h.syncDir(fsys, dir, "fsync data dir"); err != nil {
		return nil, err
	}
	return m, nil
}

// cleanReader decodes the manifest; the first shortfall sticks.
type cleanReader struct {
	b   []byte
	bad bool
}

func (r *cleanReader) take(n int) []byte {
	if r.bad || n < 0 || len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *cleanReader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (r *cleanReader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *cleanReader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (r *cleanReader) str() string { return string(r.take(int(r.u16()))) }

// list reads a count and that many int64s, refusing a count the rest of
// the payload cannot hold.
func (r *cleanReader) list() []int64 {
	n := int(r.u32())
	if r.bad || n > len(r.b)/8 {
		r.bad = true
		return nil
	}
	l := make([]int64, n)
	for i := range l {
		l[i] = int64(r.u64())
	}
	return l
}

func parseCleanClose(data []byte, logID string) (map[partitionKey]*cleanEntry, error) {
	if len(data) < 8 || int(binary.BigEndian.Uint32(data)) != len(data)-8 {
		return nil, errors.New("truncated")
	}
	body := data[8:]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(data[4:]) {
		return nil, errors.New("checksum mismatch")
	}
	r := &cleanReader{b: body}
	if v := r.u16(); v != cleanCloseVersion {
		return nil, fmt.Errorf("version %d, want %d", v, cleanCloseVersion)
	}
	if id := r.str(); id != logID {
		return nil, fmt.Errorf("written for log %q, this is %q", id, logID)
	}
	n := int(r.u32())
	m := make(map[partitionKey]*cleanEntry, min(n, len(r.b)/40))
	for i := 0; i < n && !r.bad; i++ {
		k := partitionKey{topic: r.str(), id: int32(r.u32())}
		e := &cleanEntry{}
		e.id = dirIdentity{dev: r.u64(), ino: r.u64(), mtime: int64(r.u64()), ctime: int64(r.u64())}
		if f := r.take(1); f != nil {
			e.flags = f[0]
		}
		e.bases, e.snaps = r.list(), r.list()
		// A copy: the partition keeps parts of its recovery point (the
		// producer state), which must not hold the whole manifest.
		e.recovery = bytes.Clone(r.take(int(r.u32())))
		if len(e.bases) == 0 {
			r.bad = true
		}
		m[k] = e
	}
	if r.bad || len(r.b) != 0 {
		return nil, errors.New("malformed")
	}
	return m, nil
}
