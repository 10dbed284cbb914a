package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// The journal is the broker's write-ahead log under SyncBeforeAck. Every
// appended batch is written to its partition's segment and, in the same
// order, to the journal; one fsync of the journal then makes the batches of
// every partition durable at once, where each partition's segment would need
// an fsync of its own (a write spread over eight partitions cost eight).
// The records are gathered in memory and written with one write(2) just
// before the fsync that acknowledges them (or when 1 MiB is waiting): a
// relay batch spread over 8,000 partitions made 8,000 writes otherwise. The
// segments are fsynced in the background, in a checkpoint each time the
// journal file passes rotateAt (64 MiB, or 32 KiB per partition it covers
// up to 1 GiB), after which the journal files the
// checkpoint covers are deleted. A clean Close fsyncs every segment and
// deletes the journal.
//
// Opening the broker replays the journal into the partitions: a batch whose
// offsets a partition's log already holds is skipped, one that continues
// the log is appended (a machine crash lost it from the segment, which
// recovery cut back to its last whole batch), and a gap is reported.
//
// File format: a 16-byte header (magic "RJNL", version 1, and the number
// of bytes of the previous journal file that are valid, -1 for all), then
// records: uint32 length and uint32 CRC-32C of the rest, then the topic
// name (uint16 length, bytes), the partition (int32) and the batch as
// stored, base offset included. A file ends at its first short or damaged
// record.
//
// Faults. A failed or short write of the gathered records (a full disk) is
// cut off the file again, and every record not yet fsynced is given up:
// the partitions they belong to roll back to what is durable (their
// appends, none of them acknowledged, fail with the write's error, and
// producers retry them), and before anything more is written the journal
// starts a new file whose header bounds the old one at what was last made
// durable, so neither a torn record nor one rolled back is replayed. Until
// the rollback has run, appends fail. A process killed with records only in
// memory loses appends that were not acknowledged, as a kill before the
// write did. A failed fsync is not handled here: it fails the broker
// (health.go) until it is reopened. Tests:
// TestJournalWriteFaultGivesUpUnsyncedBatches, TestJournalWriteFaultUnderLoad,
// TestWriteAndReadFaults, TestDiskFaults.

const (
	journalDir       = "journal"
	journalSuffix    = ".journal"
	journalMagic     = "RJNL"
	journalHeader    = 16
	journalRecHeader = 8
	// journalFileBytes is the size at which the journal starts a new file
	// and checkpoints the segments the old ones cover, when the file
	// covers few partitions.
	journalFileBytes = 64 << 20
	// journalBytesPerPartition raises that size to this much per
	// partition the file covers, up to journalMaxFileBytes: a checkpoint
	// costs three fsyncs per partition (segment, recovery point,
	// directory), so with 8,000 partitions written a checkpoint every
	// 64 MiB cost 24,000 fsyncs for 8 KiB of each partition's data, and
	// the appends waited behind them.
	journalBytesPerPartition = 32 << 10
	journalMaxFileBytes      = 1 << 30
	// checkpointParallelism is how many segments a checkpoint fsyncs at
	// a time.
	checkpointParallelism = 16
	// journalBufferBytes is how much of the records an append writes
	// before the next fsync asks for them.
	journalBufferBytes = 1 << 20
)

// journalEntry is a batch written since the last journal fsync; the fsync
// makes its partition durable through end.
type journalEntry struct {
	p      *partition
	end    int64 // partition offset after the batch
	endPos int64 // position in the partition's active segment after it
	gen    int   // the partition's generation when it was written
}

type journal struct {
	fs     FS
	dir    string
	logger *slog.Logger
	health *health

	// syncMu serialises fsyncs so concurrent waiters share one.
	syncMu sync.Mutex

	mu  sync.Mutex
	f   File
	num int64 // number of the current file
	// size counts the current file's bytes with those in buf; written
	// those in the file, synced those known durable.
	size, written, synced int64
	pending               []journalEntry
	// buf holds the records added since the last write, in order.
	buf []byte
	// broken is the error of a failed write: the records since synced
	// are given up (pending rolls back in sync) and the next append, once
	// pending is empty, starts a new file bounding this one at synced.
	broken error
	// rollingBack is set while a sync started by add rolls pending back.
	rollingBack atomic.Bool
	// dirty are the partitions written since the last rotation; old lists
	// the files (and their partitions) awaiting a checkpoint.
	dirty map[*partition]struct{}
	old   []oldJournal

	ckpt chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup
}

type oldJournal struct {
	num   int64
	parts map[*partition]struct{}
}

func journalName(dir string, num int64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", num, journalSuffix))
}

// listJournals returns the journal file numbers in dir, ascending.
func listJournals(fsys FS, dir string) ([]int64, error) {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var nums []int64
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), journalSuffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(name, 10, 64)
		if err != nil {
			continue
		}
		nums = append(nums, n)
	}
	sort.Slice(nums, func(i, j int) bool { return nums[i] < nums[j] })
	return nums, nil
}

// openJournal replays the journal files in dataDir into the partitions
// that lookup finds (see replayJournals), makes the replayed partitions
// durable, deletes the replayed files and starts a new one.
func openJournal(fsys FS, dataDir string, logger *slog.Logger, h *health, lookup func(topic string, part int32) *partition) (*journal, error) {
	dir := filepath.Join(dataDir, journalDir)
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, storageErr("create journal dir", err)
	}
	nums, err := listJournals(fsys, dir)
	if err != nil {
		return nil, storageErr("list journal", err)
	}
	replayed, err := replayJournals(fsys, dir, nums, logger, lookup)
	if err != nil {
		return nil, err
	}
	for p := range replayed {
		if err := p.syncSegment(); err != nil {
			return nil, err
		}
	}
	j := &journal{fs: fsys, dir: dir, logger: logger, health: h, dirty: map[*partition]struct{}{},
		ckpt: make(chan struct{}, 1), stop: make(chan struct{})}
	next := int64(1)
	if len(nums) > 0 {
		next = nums[len(nums)-1] + 1
	}
	if err := j.startFile(next, -1); err != nil {
		return nil, err
	}
	for _, num := range nums {
		if err := fsys.Remove(journalName(dir, num)); err != nil {
			_ = j.f.Close()
			return nil, storageErr("remove replayed journal", err)
		}
	}
	if err := h.syncDir(fsys, dir, "fsync journal dir"); err != nil {
		_ = j.f.Close()
		return nil, err
	}
	j.wg.Add(1)
	go j.checkpointLoop()
	return j, nil
}

// readJournalBound reads the bound a journal file's header puts on the
// previous file: -1 (none) when the header is missing or damaged.
func readJournalBound(fsys FS, path string) int64 {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return -1
	}
	defer f.Close()
	var hdr [journalHeader]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil || string(hdr[:4]) != journalMagic {
		return -1
	}
	return int64(binary.BigEndian.Uint64(hdr[8:]))
}

// replayPlan is what the first pass over the journal learns about one
// partition: the first batch it holds at or above the active segment's
// base, where its batches end, and whether they form one unbroken run.
type replayPlan struct {
	first, next int64
	broken      bool
}

// replayJournals replays the journal files nums in two passes. The first
// finds, per partition, the first batch the journal holds for its active
// segment. When the journal holds an unbroken run of batches from there,
// the segment is cut back to that batch and the run is appended again:
// everything written since the last checkpoint is rewritten and fsynced,
// so neither a torn write nor bytes the kernel dropped after a failed
// fsync (while the page cache still shows them) nor a flipped bit in that
// range survives. The second pass appends: a batch the log holds already is
// skipped, one that continues it is appended, and one beyond the log end
// is appended after reporting the offsets in between as lost. It returns
// the partitions it appended to.
func replayJournals(fsys FS, dir string, nums []int64, logger *slog.Logger, lookup func(string, int32) *partition) (map[*partition]struct{}, error) {
	bounds := make([]int64, len(nums))
	for i := range nums {
		bounds[i] = -1
		if i+1 < len(nums) {
			bounds[i] = readJournalBound(fsys, journalName(dir, nums[i+1]))
		}
	}
	plans := map[*partition]*replayPlan{}
	skipped := 0
	for i, num := range nums {
		n, err := walkJournal(fsys, journalName(dir, num), bounds[i], logger, true, func(p *partition, batch []byte) error {
			h, err := VerifyBatch(batch)
			if err != nil {
				if pl := plans[p]; pl != nil {
					pl.broken = true
				}
				return nil
			}
			base := p.activeBase()
			if h.LastOffset() < base {
				return nil
			}
			pl := plans[p]
			switch {
			case pl == nil:
				plans[p] = &replayPlan{first: h.BaseOffset, next: h.LastOffset() + 1}
			case h.BaseOffset != pl.next:
				pl.broken = true
			default:
				pl.next = h.LastOffset() + 1
			}
			return nil
		}, lookup)
		if err != nil {
			return nil, err
		}
		skipped += n
	}
	for p, pl := range plans {
		p.mu.Lock()
		p.journalEnd = pl.next
		p.mu.Unlock()
	}
	if skipped == 0 {
		for p, pl := range plans {
			if !pl.broken {
				if err := p.rewindTo(pl.first); err != nil {
					return nil, err
				}
			}
		}
	}
	replayed := map[*partition]struct{}{}
	for i, num := range nums {
		path := journalName(dir, num)
		records, appended := 0, 0
		_, err := walkJournal(fsys, path, bounds[i], logger, false, func(p *partition, batch []byte) error {
			records++
			did, err := p.replay(batch)
			if did {
				appended++
				replayed[p] = struct{}{}
			}
			return err
		}, lookup)
		if err != nil {
			return nil, err
		}
		if appended > 0 {
			logger.Info("replayed the journal into the segments", "file", path, "records", records, "appended", appended)
		}
	}
	return replayed, nil
}

// walkJournal calls fn for each record of a journal file whose partition
// lookup finds, up to limit bytes (-1: all). A file ends at its first short
// record, or at a damaged one that no good record follows (a torn write,
// never acknowledged); a damaged record with good ones after it is skipped
// and reported. It returns the number of records skipped so.
func walkJournal(fsys FS, path string, limit int64, logger *slog.Logger, quiet bool, fn func(p *partition, batch []byte) error, lookup func(string, int32) *partition) (int, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0, storageErr("open journal", err)
	}
	defer f.Close()
	size, err := fileSize(f)
	if err != nil {
		return 0, storageErr("stat journal", err)
	}
	if limit >= 0 && limit < size {
		size = limit
	}
	var hdr [journalHeader]byte
	if size < journalHeader {
		return 0, nil
	}
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return 0, storageErr("read journal", err)
	}
	if string(hdr[:4]) != journalMagic {
		return 0, fmt.Errorf("%w: %s is not a journal file", ErrCorruptBatch, path)
	}
	pos := int64(journalHeader)
	var buf []byte
	skipped := 0
	// record reads the record at pos: its body, and whether it is whole
	// and sound; n is its length field when plausible.
	record := func(pos int64) (rec []byte, n int64, ok bool, err error) {
		var rh [journalRecHeader]byte
		if pos+journalRecHeader > size {
			return nil, 0, false, nil
		}
		if _, err := f.ReadAt(rh[:], pos); err != nil {
			return nil, 0, false, storageErr("read journal", err)
		}
		n = int64(binary.BigEndian.Uint32(rh[:4]))
		if n < 6+BatchHeaderSize || pos+journalRecHeader+n > size {
			return nil, 0, false, nil
		}
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		rec = buf[:n]
		if _, err := f.ReadAt(rec, pos+journalRecHeader); err != nil {
			return nil, 0, false, storageErr("read journal", err)
		}
		if crc32.Checksum(rec, castagnoli) != binary.BigEndian.Uint32(rh[4:]) {
			return nil, n, false, nil
		}
		if tlen := int(binary.BigEndian.Uint16(rec)); 2+tlen+4 > len(rec) {
			return nil, n, false, nil
		}
		return rec, n, true, nil
	}
	for pos < size {
		rec, n, ok, err := record(pos)
		if err != nil {
			return skipped, err
		}
		if !ok {
			if n == 0 {
				break
			}
			if _, _, nextOK, err := record(pos + journalRecHeader + n); err != nil || !nextOK {
				break
			}
			if !quiet {
				logger.Error("skipping a damaged journal record that good records follow; its batch may be lost", "file", path, "pos", pos, "bytes", journalRecHeader+n)
			}
			skipped++
			pos += journalRecHeader + n
			continue
		}
		tlen := int(binary.BigEndian.Uint16(rec))
		topicName := string(rec[2 : 2+tlen])
		part := int32(binary.BigEndian.Uint32(rec[2+tlen:]))
		batch := rec[2+tlen+4:]
		pos += journalRecHeader + n
		p := lookup(topicName, part)
		if p == nil {
			continue
		}
		if err := fn(p, batch); err != nil {
			return skipped, err
		}
	}
	if pos < size && !quiet {
		logger.Warn("journal ends in a torn or damaged record; the rest was never acknowledged", "file", path, "valid_bytes", pos, "ignored_bytes", size-pos)
	}
	return skipped, nil
}

// startFile creates journal file num, whose header bounds the previous
// file at prevValid bytes (-1: all of it).
func (j *journal) startFile(num, prevValid int64) error {
	path := journalName(j.dir, num)
	f, err := j.fs.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return storageErr("create journal", err)
	}
	var hdr [journalHeader]byte
	copy(hdr[:], journalMagic)
	binary.BigEndian.PutUint32(hdr[4:], 1)
	binary.BigEndian.PutUint64(hdr[8:], uint64(prevValid))
	if _, err := f.Write(hdr[:]); err != nil {
		_ = f.Close()
		_ = j.fs.Remove(path)
		return storageErr("write journal header", err)
	}
	if err := j.health.sync(f, "fsync journal"); err != nil {
		_ = f.Close()
		return err
	}
	if err := j.health.syncDir(j.fs, j.dir, "fsync journal dir"); err != nil {
		_ = f.Close()
		return err
	}
	j.f, j.num, j.size, j.written, j.synced, j.broken = f, num, journalHeader, journalHeader, journalHeader, nil
	j.buf = j.buf[:0]
	return nil
}

// rotateLocked starts the next journal file, bounding the current one at
// bound bytes (-1: all of it), and hands the current one to the checkpoint.
func (j *journal) rotateLocked(bound int64) error {
	old, num := j.f, j.num
	if err := j.startFile(num+1, bound); err != nil {
		return err
	}
	_ = old.Close()
	j.old = append(j.old, oldJournal{num: num, parts: j.dirty})
	j.dirty = map[*partition]struct{}{}
	return nil
}

// add records a batch p just appended (its offsets ending at end, its
// segment at endPos); the next sync writes it. Called with p.mu held, so
// each partition's records are in its log order.
func (j *journal) add(p *partition, batch []byte, end, endPos int64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.health.check(); err != nil {
		return err
	}
	if j.broken != nil {
		if len(j.pending) > 0 {
			// Records given up by the failed write still wait for their
			// rollback; a batch behind them would take offsets they hold.
			j.rollBackLater()
			return storageErr("write journal", j.broken)
		}
		if err := j.rotateLocked(j.synced); err != nil {
			return err
		}
	}
	n := 2 + len(p.topic) + 4 + len(batch)
	if len(j.buf) > 0 && len(j.buf)+journalRecHeader+n > journalBufferBytes {
		if err := j.writeLocked(); err != nil {
			j.rollBackLater()
			return err
		}
	}
	start := len(j.buf)
	buf := j.buf
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	buf = binary.BigEndian.AppendUint32(buf, 0)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(p.topic)))
	buf = append(buf, p.topic...)
	buf = binary.BigEndian.AppendUint32(buf, uint32(p.id))
	buf = append(buf, batch...)
	binary.BigEndian.PutUint32(buf[start+4:], crc32.Checksum(buf[start+journalRecHeader:], castagnoli))
	j.buf = buf
	j.size += int64(len(buf) - start)
	j.pending = append(j.pending, journalEntry{p: p, end: end, endPos: endPos, gen: p.gen})
	j.dirty[p] = struct{}{}
	return nil
}

// rollBackLater rolls back the records a failed write gave up, in a sync
// of its own: their appenders may never wait for them, and the rollback
// takes the partitions' locks, which an append holds while it calls add.
func (j *journal) rollBackLater() {
	if j.rollingBack.CompareAndSwap(false, true) {
		go func() {
			defer j.rollingBack.Store(false)
			_ = j.sync()
		}()
	}
}

// writeLocked writes the gathered records to the file. On failure it cuts
// the file back to its last whole record (if even that fails, the bound the
// next file puts on this one cuts it) and gives up every record since the
// last fsync: they are not all in the file, and the next sync rolls their
// partitions back.
func (j *journal) writeLocked() error {
	if len(j.buf) == 0 {
		return nil
	}
	n, err := j.f.Write(j.buf)
	if err == nil && n < len(j.buf) {
		err = io.ErrShortWrite
	}
	if err != nil {
		_ = j.f.Truncate(j.written)
		j.broken = err
		j.size = j.written
		j.buf = j.buf[:0]
		return storageErr("write journal", err)
	}
	j.written += int64(n)
	if cap(j.buf) > 4*journalBufferBytes {
		j.buf = nil
	} else {
		j.buf = j.buf[:0]
	}
	return nil
}

// sync makes every record written so far durable and advances the
// partitions they belong to. A failed fsync fails the broker (health.go):
// the waiting appends fail and nothing more is acknowledged until the
// broker is reopened; the fsync is never retried.
func (j *journal) sync() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if err := j.health.check(); err != nil {
		return err
	}
	j.mu.Lock()
	if j.broken == nil && j.size == j.synced && len(j.pending) == 0 {
		j.mu.Unlock()
		return nil
	}
	if j.broken == nil {
		_ = j.writeLocked()
	}
	if j.broken != nil {
		// Records since the last fsync were given up by a failed
		// write: their partitions roll back.
		err, entries := j.broken, j.pending
		j.pending = nil
		j.mu.Unlock()
		werr := storageErr("write journal", err)
		for _, e := range entries {
			e.p.rollBack(e.gen, werr)
		}
		return werr
	}
	f, upTo, entries := j.f, j.size, j.pending
	j.pending = nil
	j.mu.Unlock()

	err := j.health.sync(f, "fsync journal")

	j.mu.Lock()
	if err == nil {
		j.synced = upTo
		// A write that failed since upTo (an append's, at 1 MiB) gave
		// up the records after it: the next sync rolls them back, and
		// the next append rotates the file.
		if j.broken == nil && j.size >= rotateAt(len(j.dirty)) && j.writeLocked() == nil {
			// The old file is fsynced once more, under mu, so that the
			// records written since upTo are durable before the new
			// file starts.
			entries = append(entries, j.pending...)
			j.pending = nil
			if err = j.health.sync(j.f, "fsync journal"); err == nil {
				j.synced = j.size
				if rerr := j.rotateLocked(-1); rerr != nil {
					// Stay on the old file; the next sync tries again.
					j.logger.Warn("starting a new journal file failed", "err", rerr)
				} else {
					select {
					case j.ckpt <- struct{}{}:
					default:
					}
				}
			}
		}
	}
	j.mu.Unlock()
	if err != nil {
		return err
	}
	for _, e := range entries {
		e.p.markDurable(e)
	}
	return nil
}

// rotateAt is the size at which a journal file covering parts partitions
// is rotated and checkpointed.
func rotateAt(parts int) int64 {
	return min(max(journalFileBytes, int64(parts)*journalBytesPerPartition), journalMaxFileBytes)
}

// checkpointLoop fsyncs the segments that rotated-out journal files cover,
// then deletes those files.
func (j *journal) checkpointLoop() {
	defer j.wg.Done()
	for {
		select {
		case <-j.stop:
			return
		case <-j.ckpt:
		}
		if err := j.checkpoint(); err != nil {
			j.logger.Error("journal checkpoint failed; the journal files stay until the broker is reopened", "err", err)
		}
	}
}

func (j *journal) checkpoint() error {
	if err := j.health.check(); err != nil {
		return err
	}
	j.mu.Lock()
	old := j.old
	j.mu.Unlock()
	if len(old) == 0 {
		return nil
	}
	parts := map[*partition]struct{}{}
	for _, o := range old {
		for p := range o.parts {
			parts[p] = struct{}{}
		}
	}
	// The segments are fsynced side by side (each with its recovery
	// point): with thousands of partitions one after another, a
	// checkpoint took as many fsyncs in series.
	list := slices.Collect(maps.Keys(parts))
	if err := errors.Join(parallel(len(list), checkpointParallelism, func(i int) error { return list[i].syncSegment() })...); err != nil {
		return err
	}
	for _, o := range old {
		if err := j.fs.Remove(journalName(j.dir, o.num)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return storageErr("remove journal", err)
		}
	}
	if err := j.health.syncDir(j.fs, j.dir, "fsync journal dir"); err != nil {
		return err
	}
	j.mu.Lock()
	j.old = j.old[len(old):]
	j.mu.Unlock()
	return nil
}

// close stops the checkpointer. When clean (every partition closed with its
// segments fsynced), the journal files are no longer needed and are
// removed; otherwise they stay for the next open to replay.
func (j *journal) close(clean bool) error {
	close(j.stop)
	j.wg.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	if !clean && j.broken == nil {
		// Records not acknowledged yet; the next open may replay them.
		_ = j.writeLocked()
	}
	err := j.f.Close()
	if !clean {
		return err
	}
	nums, lerr := listJournals(j.fs, j.dir)
	if lerr != nil {
		return errors.Join(err, storageErr("list journal", lerr))
	}
	for _, num := range nums {
		if rerr := j.fs.Remove(journalName(j.dir, num)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, storageErr("remove journal", rerr))
		}
	}
	return errors.Join(err, j.fs.SyncDir(j.dir))
}
