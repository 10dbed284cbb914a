package broker

import (
	"container/list"
	"errors"
	"io"
	"os"
	"sync"
	"time"
)

// Write-back of the active segments under SyncBeforeAck.
//
// An append under SyncBeforeAck is durable once the journal's fsync
// covered it; the segment's copy matters only from the next checkpoint,
// roll or close, which fsync the segment first. Writing it at once cost a
// write system call per batch and partition: a relay batch of 1,000 events
// over 8,000 partitions paid about 1,000 of them, each updating the file's
// size and times. writeBackFS keeps what was appended to a segment since its last
// write in memory instead, and writes it when the file's share passes
// writeBackFileBytes, when the buffers of all files together take more
// memory than the broker's bound (their capacity counts, not only the
// bytes in them; the file buffered longest is written first, by the
// broker's write-back loop from three quarters of the bound on, so that
// the system calls run beside the appends), when its oldest buffered
// byte is writeBackMaxAge old (so that `relay log dump` and Inspect,
// which read the files of a running broker, lag by about that much at
// most), or when the file is fsynced, truncated or closed. Reads
// see the buffered bytes, so a fetch of the freshest records is served
// from memory.
//
// Fault model, and how we know:
//   - Process killed, or the machine lost: the buffered bytes are gone
//     from the segment, as unsynced page-cache bytes are after a power
//     loss; the journal holds every batch since the last checkpoint, and
//     the next open appends the missing ones again (replay, see
//     Durability in doc.go). TestWriteBackKilledWithBufferedBatches kills a
//     child with batches only in memory and reads every acknowledged
//     record back; the crash loops (TestCrashChild) run with write-back on.
//   - A failed or short write (a full disk): the bytes written stay, the
//     rest stay buffered, and nothing is acknowledged differently (the
//     journal made the batches durable). Appends go on while the journal
//     can be written; the fsync that needed the bytes (a checkpoint, a
//     roll, Close) fails with a storage error that does not fail the
//     broker (nothing was dropped from the page cache), so the checkpoint
//     keeps its journal files and tries again at the next one, a roll
//     fails its append, and Close leaves the journal for the next open.
//     TestWriteBackWriteFaults.
//   - A failed fsync: as without write-back (health.go); the bytes were
//     written first.
//   - Counters: positions are int64 byte offsets bounded by segment.bytes.
//   - Clock steps: ages are read on the monotonic clock (time.Now, Before).
//
// Under SyncIntervalUnsafe there is no journal, and nothing is buffered.

const (
	// writeBackFileBytes is how much one file buffers before it is
	// written: a write that fills it goes to the file at once.
	writeBackFileBytes = 128 << 10
	// defaultWriteBackBytes is the broker-wide bound by default. Until
	// the bound counted the buffers' capacity it was 16 MiB of bytes,
	// which took about 57 MB of buffers with 8,000 partitions written a
	// few KiB at a time; 32 MiB of buffers writes as often with less.
	defaultWriteBackBytes = 32 << 20
	// writeBackMaxAge is how long a byte stays buffered at most, give or
	// take a tick of the broker's write-back loop.
	writeBackMaxAge = time.Second
	// Past writeBackHigh of the bound (in eighths), an append wakes the
	// write-back loop, which writes the files buffered longest until the
	// buffers are within writeBackLow of it: the write system calls then
	// run beside the appends, not in them. An append writes them itself
	// only past the whole bound, when the loop fell behind.
	writeBackHigh, writeBackLow = 6, 5
)

// writeBackError is a failed write of buffered bytes. It is a storage
// error but not a failed fsync: health.sync does not fail the broker for
// it.
type writeBackError struct{ err error }

func (e *writeBackError) Error() string { return "writing buffered segment bytes: " + e.err.Error() }
func (e *writeBackError) Unwrap() error { return e.err }

// writeBackFS buffers the writes of segment files opened for appending;
// everything else goes to FS.
type writeBackFS struct {
	FS
	pool *writeBackPool
}

func newWriteBackFS(fsys FS, limit int64) FS {
	return writeBackFS{FS: fsys, pool: &writeBackPool{limit: limit, wake: make(chan struct{}, 1)}}
}

func (w writeBackFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := w.FS.OpenFile(name, flag, perm)
	if err != nil || flag&os.O_APPEND == 0 || !isSegmentLog(name) {
		return f, err
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &writeBackFile{File: f, pool: w.pool, info: info, written: info.Size()}, nil
}

// writeBackPool bounds the memory of the buffers held across the
// broker's files.
type writeBackPool struct {
	limit int64
	// wake asks the write-back loop to write buffers out (writeBackHigh).
	wake chan struct{}

	mu sync.Mutex
	// buffered is the capacity of the buffers the files hold, not only
	// the bytes in them: a buffer grows by doubling, and with thousands
	// of files each holding a few KiB, counting their bytes let them take
	// about three times the bound.
	buffered int64
	dirty    list.List // of *writeBackFile holding buffered bytes, oldest first
}

// trim writes the files that buffered longest until the pool is within its
// bound.
func (p *writeBackPool) trim() {
	p.writeOut(func(*writeBackFile) bool { return p.buffered > p.limit })
}

// settle follows an append: past the bound it trims the pool itself, and
// past writeBackHigh of it wakes the write-back loop to write it down.
func (p *writeBackPool) settle() {
	p.mu.Lock()
	buffered := p.buffered
	p.mu.Unlock()
	switch {
	case buffered > p.limit:
		p.trim()
	case buffered > p.limit/8*writeBackHigh:
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// writeDown writes the files that buffered longest until the pool is
// within writeBackLow of its bound.
func (p *writeBackPool) writeDown() {
	p.writeOut(func(*writeBackFile) bool { return p.buffered > p.limit/8*writeBackLow })
}

// writeOlder writes the files whose oldest buffered byte came before
// cutoff.
func (p *writeBackPool) writeOlder(cutoff time.Time) {
	p.writeOut(func(f *writeBackFile) bool { return f.since.Before(cutoff) })
}

// writeOut writes the files that buffered longest while due(the oldest),
// called with mu held, says so. A file that fails keeps its bytes (and its
// error, for its next fsync), and writeOut stops there: the disk refuses
// writes (it is full, say), so the journal's do too and appends stop
// growing the buffers.
func (p *writeBackPool) writeOut(due func(oldest *writeBackFile) bool) {
	for {
		p.mu.Lock()
		if p.dirty.Len() == 0 || !due(p.dirty.Front().Value.(*writeBackFile)) {
			p.mu.Unlock()
			return
		}
		f := p.dirty.Remove(p.dirty.Front()).(*writeBackFile)
		f.elem = nil
		p.mu.Unlock()
		f.mu.Lock()
		err := f.flushLocked()
		f.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// writeBackFile is a segment file whose appended bytes past written are
// held in buf until written. Lock order: writeBackFile.mu, then
// writeBackPool.mu.
type writeBackFile struct {
	File
	pool *writeBackPool
	// info is the file as opened (see Stat).
	info os.FileInfo

	mu      sync.Mutex
	buf     []byte
	written int64 // size of the file on disk
	hint    int   // capacity for the next buffer
	elem    *list.Element
	since   time.Time // when buf last became non-empty (under pool.mu)
	// err is the last failed write of buf, returned by Sync until a
	// write succeeds.
	err error
}

// account changes the pool's count by n, a change of the file's buffer
// capacity, and puts the file on the dirty list when it holds bytes, or
// takes it off when it holds none.
func (f *writeBackFile) account(n int64) {
	p := f.pool
	p.mu.Lock()
	p.buffered += n
	switch {
	case len(f.buf) > 0 && f.elem == nil:
		f.elem, f.since = p.dirty.PushBack(f), time.Now()
	case len(f.buf) == 0 && f.elem != nil:
		p.dirty.Remove(f.elem)
		f.elem = nil
	}
	p.mu.Unlock()
}

// flushLocked writes buf. A short write keeps what it wrote: those bytes
// are the buffer's first ones, in place.
func (f *writeBackFile) flushLocked() error {
	if len(f.buf) == 0 {
		return nil
	}
	held := len(f.buf)
	n, err := f.File.Write(f.buf)
	f.written += int64(n)
	rest := copy(f.buf, f.buf[n:])
	f.buf = f.buf[:rest]
	if err == nil && rest > 0 {
		err = io.ErrShortWrite
	}
	if err != nil {
		f.account(0)
		f.err = &writeBackError{err: err}
		return f.err
	}
	f.err = nil
	// The buffer goes back to the pool: buffers held by idle files would
	// make the broker's memory grow with its partitions, not with the
	// bound. The next one starts large enough for what this one held, not
	// as large as it grew: a file written out by the bound a few KiB at a
	// time would otherwise keep a buffer its bytes never fill.
	f.hint = held
	f.releaseLocked()
	return nil
}

// releaseLocked gives the buffer back, with whatever it still holds, and
// its capacity back to the pool's bound.
func (f *writeBackFile) releaseLocked() {
	n := cap(f.buf)
	putBuffer(f.buf)
	f.buf = nil
	f.account(-int64(n))
}

// Buffers come in powers of two from 1 KiB to writeBackFileBytes, each
// size pooled, so that files taking turns to buffer reuse them rather than
// leave garbage behind.
const (
	minBufferShift = 10
	bufferClasses  = 8 // 1 KiB .. 128 KiB
)

var bufferPools [bufferClasses]sync.Pool

// bufferClass is the smallest class holding n bytes, or -1 when none does.
func bufferClass(n int) int {
	for c := range bufferClasses {
		if n <= 1<<(minBufferShift+c) {
			return c
		}
	}
	return -1
}

// getBuffer returns an empty buffer of at least n bytes.
func getBuffer(n int) []byte {
	c := bufferClass(n)
	if c < 0 {
		return make([]byte, 0, n)
	}
	if b, ok := bufferPools[c].Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 1<<(minBufferShift+c))
}

// putBuffer gives b back, when it is one of the pooled sizes.
func putBuffer(b []byte) {
	if c := bufferClass(cap(b)); c >= 0 && cap(b) == 1<<(minBufferShift+c) {
		bufferPools[c].Put(&b)
	}
}

// Write appends b to the buffer, writing the buffer out when it reaches
// writeBackFileBytes. It never fails: a failed write keeps the bytes, and
// the file's next Sync reports it.
func (f *writeBackFile) Write(b []byte) (int, error) {
	f.mu.Lock()
	grown := 0
	if need := len(f.buf) + len(b); need > cap(f.buf) {
		nb := getBuffer(max(need, f.hint, 2*cap(f.buf)))
		nb = append(nb, f.buf...)
		putBuffer(f.buf)
		grown = cap(nb) - cap(f.buf)
		f.buf = nb
	}
	f.buf = append(f.buf, b...)
	f.account(int64(grown))
	if len(f.buf) >= writeBackFileBytes {
		// A failure keeps the bytes buffered, for the next write or the
		// fsync to try again and report.
		_ = f.flushLocked()
	}
	f.mu.Unlock()
	f.pool.settle()
	return len(b), nil
}

// ReadAt reads the file's bytes on disk and then the buffered ones.
func (f *writeBackFile) ReadAt(b []byte, off int64) (int, error) {
	f.mu.Lock()
	written := f.written
	if off+int64(len(b)) <= written {
		f.mu.Unlock()
		// Bytes on disk stay there: a write only appends, and a
		// truncate below them comes from the partition, which does not
		// read what it cuts.
		return f.File.ReadAt(b, off)
	}
	defer f.mu.Unlock()
	n := 0
	if off < written {
		var err error
		if n, err = f.File.ReadAt(b[:written-off], off); err != nil {
			return n, err
		}
	}
	from := off + int64(n) - written
	if from >= int64(len(f.buf)) {
		return n, io.EOF
	}
	n += copy(b[n:], f.buf[from:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

// Truncate cuts the buffer, and the file when size is below what was
// written.
func (f *writeBackFile) Truncate(size int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size >= f.written {
		if keep := size - f.written; keep < int64(len(f.buf)) {
			f.buf = f.buf[:keep]
			if keep == 0 {
				f.releaseLocked()
			} else {
				f.account(0)
			}
		}
		return nil
	}
	if err := f.File.Truncate(size); err != nil {
		return err
	}
	f.releaseLocked()
	f.written = size
	f.err = nil
	return nil
}

// Stat reports the file as it was opened, its size counting the buffered
// bytes, without a system call: the broker reads only a segment file's
// size, which it keeps, and its identity (os.SameFile), which an open
// descriptor does not change. An active segment's open stats it once, not
// twice.
func (f *writeBackFile) Stat() (os.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bufferedInfo{FileInfo: f.info, size: f.written + int64(len(f.buf))}, nil
}

// Sync writes the buffer, then fsyncs. A failed write returns a
// writeBackError. Appends and reads go on during the fsync, which covers
// what was written before it.
func (f *writeBackFile) Sync() error {
	f.mu.Lock()
	err := f.flushLocked()
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.File.Sync()
}

// Close writes the buffer and closes the file. The file is closed even
// when the write fails; its bytes are then in the journal only.
func (f *writeBackFile) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ferr := f.flushLocked()
	f.releaseLocked()
	return errors.Join(ferr, f.File.Close())
}

type bufferedInfo struct {
	os.FileInfo
	size int64
}

func (i bufferedInfo) Size() int64 { return i.size }

// writeBackLoop writes what stayed buffered for writeBackMaxAge, every
// half of it, and writes the pool down when an append asks, until stop.
func writeBackLoop(stop <-chan struct{}, p *writeBackPool) {
	tick := time.NewTicker(writeBackMaxAge / 2)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			p.writeOlder(time.Now().Add(-writeBackMaxAge))
		case <-p.wake:
			p.writeDown()
		}
	}
}
