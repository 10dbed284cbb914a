package broker

import (
	"errors"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// partitionSettings are the knobs a partition needs from the broker options
// and its topic configuration.
type partitionSettings struct {
	fs             FS
	syncBeforeAck  bool
	indexInterval  int
	maxOpenReaders int
	now            func() time.Time
	logger         *slog.Logger
	// cfg is the topic's configuration; AlterTopicConfig swaps it.
	cfg atomic.Pointer[TopicConfig]
	// journal, under SyncBeforeAck, makes appends durable with one fsync
	// for every partition (see journal.go); nil otherwise.
	journal *journal
	// allowLost opens a partition whose directory vanished (empty, with
	// the loss reported) instead of refusing.
	allowLost bool
	// health turns sticky on the first failed fsync (health.go).
	health *health
	// compactionMapBytes bounds compaction's key map (offsetmap.go).
	compactionMapBytes int64
}

// config returns the topic's current configuration.
func (s *partitionSettings) config() TopicConfig { return *s.cfg.Load() }

// partition is one ordered log: a list of segments, the last one active.
//
// Locking: mu guards the segment list, offsets, producer state and the
// active segment's in-memory index; appends hold it only for the write
// syscall. syncMu serialises fsyncs so concurrent appenders queue behind one
// fsync and are then all covered by it (group commit). cleanMu serialises
// retention and compaction. Lock order: syncMu, then mu, then segment.mu.
type partition struct {
	topic string
	id    int32
	dir   string
	set   *partitionSettings

	mu   sync.Mutex
	segs []*segment
	next int64 // log end offset: offset of the next appended record
	// appended counts the bytes of the batches appended since the
	// partition was opened (for the append-rate metrics).
	appended int64
	// hw is the high watermark, the end of what fetches may read. With
	// fsync-before-ack it equals durable, so consumers never see records a
	// crash could take back.
	hw, hwPos           int64
	durable, durablePos int64
	// gen counts rollbacks to the durable state; resetPoints[g] is where
	// and why generation g ended, so an appender from generation g knows
	// whether its data survived, and if not, why.
	gen         int
	resetPoints []resetPoint
	producers   producerTable
	// txns are the partition's open and aborted transactions, rebuilt
	// with producers.
	txns txnIndex
	// hwCh is closed when the high watermark next moves or the partition
	// closes. It is made when a listener asks for it (watchLocked), not at
	// every move: with thousands of partitions that nobody fetches from,
	// a channel made for each at every journal fsync was a visible share
	// of the appends' allocations.
	hwCh chan struct{}
	// lost are the ranges reported lost (lost.go); candidates is damage
	// found while opening that the journal may still repair.
	lost       []LostRange
	candidates []LostRange
	// journalEnd is the offset after the last batch the journal held for
	// the partition when it opened (0: none).
	journalEnd int64
	// broken is a failed rollback (its truncate or fsync): the next
	// append tries the rollback again.
	broken error
	// torn is a failed append's bytes past the active segment's size that
	// could not be cut at once: the next append (or Close) cuts them
	// first. The batches before them stay, as their journal records do.
	torn   error
	closed bool
	clock  uint64
	// startFloor is the log start DeleteRecords set (its file, logStartFile);
	// records below it are gone even where their segment stays.
	startFloor int64

	syncMu  sync.Mutex
	cleanMu sync.Mutex
	// dirDirty says the directory may hold an entry (the active segment
	// opened or created by openPartition) not yet fsynced into it.
	dirDirty atomic.Bool
}

// syncDirIfDirty fsyncs the partition directory if the active segment's
// entry may not be durable yet. Every path that makes the segment's
// contents durable in their own right (a checkpoint before it deletes the
// journal, Close, the interval or non-journal fsync) calls it first; a
// roll fsyncs the directory itself.
func (p *partition) syncDirIfDirty() error {
	if !p.dirDirty.Load() {
		return nil
	}
	if err := p.set.health.syncDir(p.set.fs, p.dir, "fsync partition dir"); err != nil {
		return err
	}
	p.dirDirty.Store(false)
	return nil
}

func (p *partition) notifyLocked() {
	if p.hwCh != nil {
		close(p.hwCh)
		p.hwCh = nil
	}
}

// closedChan is a channel that is closed, for a listener of a closed
// partition.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// watchLocked returns a channel closed the next time the high watermark
// moves or the partition closes; closed already when the partition is.
func (p *partition) watchLocked() <-chan struct{} {
	if p.closed {
		return closedChan
	}
	if p.hwCh == nil {
		p.hwCh = make(chan struct{})
	}
	return p.hwCh
}

// whileOpen runs fn holding syncMu and mu (lockForSync), unless the
// partition is closed.
func (p *partition) whileOpen(fn func() error) error {
	p.lockForSync()
	defer p.unlockSync()
	if p.closed {
		return nil
	}
	return fn()
}

// lockOpen locks p.mu and reports true; when the partition is closed it
// leaves p.mu unlocked and reports false, so that the caller can return
// at once without an unlock of its own.
func (p *partition) lockOpen() bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	return true
}

// pinLocked keeps s's file open while it is read outside mu.
func (p *partition) pinLocked(s *segment) {
	s.refs++
	s.lastUse = p.tick()
}

func (p *partition) unpin(s *segment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.refs--
	if s.deleted && s.refs == 0 {
		_ = s.closeFiles()
	}
	p.evictReadersLocked()
}

// evictReadersLocked closes the least recently used inactive segment
// handles beyond the limit, so open files stay bounded however long the log.
func (p *partition) evictReadersLocked() {
	var open []*segment
	for _, s := range p.segs[:len(p.segs)-1] {
		if s.log != nil && s.refs == 0 {
			open = append(open, s)
		}
	}
	if len(open) <= p.set.maxOpenReaders {
		return
	}
	sort.Slice(open, func(i, j int) bool { return open[i].lastUse < open[j].lastUse })
	for _, s := range open[:len(open)-p.set.maxOpenReaders] {
		_ = s.closeFiles()
		s.idx, s.tidx, s.loaded = nil, nil, false
	}
}

// ensureOpenLocked opens a pinned inactive segment's log and loads its
// indexes. Called with mu held; the I/O is small (an index file).
func (p *partition) ensureOpenLocked(s *segment) error {
	if s.log == nil {
		f, err := p.set.fs.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
		if err != nil {
			return storageErr("open segment", err)
		}
		s.log = f
	}
	if !s.loaded && !s.loadIndexes(p.set.fs) {
		if err := s.rebuildIndexes(p.set.fs, s.log, p.set.indexInterval, false); err != nil {
			return err
		}
	}
	return nil
}

// PartitionInfo describes one partition's extent.
type PartitionInfo struct {
	Partition      int32
	LogStartOffset int64
	HighWatermark  int64
	// LogEndOffset can be ahead of HighWatermark while an fsync is pending.
	LogEndOffset int64
	Bytes        int64
	Segments     int
	// AppendedBytes are the bytes of the batches appended since the
	// broker opened the partition.
	AppendedBytes int64
	// Lost are the offset ranges found damaged or missing and not
	// repaired: the partition has a gap there (see LostRange).
	Lost []LostRange
}

func (p *partition) info() PartitionInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, s := range p.segs {
		n += s.size
	}
	pi := PartitionInfo{Partition: p.id, LogStartOffset: p.logStartLocked(), HighWatermark: p.hw, LogEndOffset: p.next, Bytes: n,
		Segments: len(p.segs), AppendedBytes: p.appended}
	if len(p.lost) > 0 {
		pi.Lost = append([]LostRange(nil), p.lost...)
	}
	return pi
}

func (p *partition) close() error { return p.whileOpen(p.closeLocked) }

func (p *partition) closeLocked() error {
	var errs []error
	active := p.segs[len(p.segs)-1]
	if err := p.cutTornLocked(); err != nil {
		// torn stays set, so nothing below claims the segment sound; the
		// next open finds the torn bytes and cuts them.
		errs = append(errs, err)
	}
	// After a storage failure nothing written since is trusted: no fsync
	// to believe, no snapshot; the next open recovers from disk. A
	// segment whose last recovery frame is at its end (nothing appended
	// since the frame, as after an open and close with no appends) needs
	// neither: the frame was written after an fsync that covered it all.
	if p.set.health.check() == nil && !p.recoveryPointCurrentLocked(active) {
		// An empty active segment lost in a crash is created again: its
		// directory entry need not be durable.
		var err error
		if active.size > 0 {
			err = p.syncDirIfDirty()
		}
		if err != nil {
			errs = append(errs, err)
		} else if err := p.set.health.sync(active.log, "fsync on close"); err != nil {
			errs = append(errs, err)
		} else if p.broken == nil && p.torn == nil {
			p.durable = p.next
			// The recovery point holds the producer state; a snapshot is
			// written only without one (an empty active segment has the
			// snapshot its roll wrote, or no producers).
			wrote := false
			if st, ok := p.recoveryStateLocked(active); ok {
				wrote = p.writeRecoveryLocked(active, st)
			}
			if !wrote && active.size > 0 {
				if err := writeSnapshot(p.set.fs, p.dir, p.next, p.producers, p.txns); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	p.closed = true
	p.closeAll()
	p.notifyLocked()
	return errors.Join(errs...)
}

// recoveryPointCurrentLocked says that s's recovery file ends with a sound
// frame at the partition's end: every byte of s was fsynced before that
// frame was written, and nothing was appended since.
func (p *partition) recoveryPointCurrentLocked(s *segment) bool {
	return p.broken == nil && p.torn == nil && !s.rpStale && s.rpNext >= 0 && s.rpNext == p.next
}

// closeAll closes the files of every segment nobody reads. A segment a
// reader has pinned (a fetch, the background check, an interval fsync
// reads its handle without p.mu) is marked deleted instead, and its last
// unpin closes it: closing under a reader would leave it a nil handle.
func (p *partition) closeAll() {
	for _, s := range p.segs {
		if s.refs > 0 {
			s.deleted = true
			continue
		}
		_ = s.closeFiles()
	}
}
