package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
)

type topic struct {
	name string
	// set is shared by the topic's partitions; its config is the topic's.
	set   *partitionSettings
	parts []*partition
}

// metadata is the broker-wide state in meta.json.
type metadata struct {
	// Version is the directory's format and CompatibleFrom the oldest
	// format a broker may know to open it anyway (format.go).
	Version        int `json:"version"`
	CompatibleFrom int `json:"compatible_from,omitempty"`
	// LogID names this log, made when the data directory is created, so a
	// writer can tell a replaced directory from the one it wrote to.
	LogID          string                    `json:"log_id,omitempty"`
	NextProducerID int64                     `json:"next_producer_id"`
	Producers      map[string]stableProducer `json:"producers"`
	Topics         map[string]TopicConfig    `json:"topics"`
}

type stableProducer struct {
	ID    int64 `json:"id"`
	Epoch int16 `json:"epoch"`
	// Internal marks an identity of the broker's own writers, which no
	// Kafka client may produce under.
	Internal bool `json:"internal,omitempty"`
}

// Broker is the embedded log: topics of partitioned, durable logs with
// Kafka's idempotent producer semantics and consumer group offsets.
type Broker struct {
	opts Options
	lock *os.File

	mu     sync.RWMutex
	topics map[string]*topic
	meta   metadata
	closed bool
	// health is the current storage state; a new one comes with each
	// successful (re)open.
	health atomic.Pointer[health]

	metaMu sync.Mutex // serialises meta.json rewrites
	groups *groupStore
	// txns is the transaction coordinator (txn.go).
	txns *txnCoordinator
	// journal makes appends durable under SyncBeforeAck (journal.go).
	journal *journal

	// reopenMu serialises Reopen and Close; running says the files are
	// open (a failed Reopen leaves them closed).
	reopenMu sync.Mutex
	running  bool
	// stop ends the background work of the current open; done ends the
	// reopen loop at Close.
	stop   chan struct{}
	wg     sync.WaitGroup
	done   chan struct{}
	loopWG sync.WaitGroup
	scrub  scrubStats
	// fsync times the storage's fsyncs (fsyncstats.go).
	fsync fsyncStats

	// kick asks the janitor for a pass now; janitorPasses counts them.
	kick          chan struct{}
	janitorPasses atomic.Int64
	// configVersion counts topic changes (created, altered, more
	// partitions, deleted), for writers that cache topic configs.
	configVersion atomic.Int64
	// defaults replaces Options.DefaultTopicConfig once set.
	defaults atomic.Pointer[TopicConfig]
	// deleted are the topics deleted since the broker opened (under mu).
	deleted map[string]bool
}

// releaseFiles closes the partitions, journal and group offsets of the
// current open. clean lets the journal go when every segment was fsynced.
func (b *Broker) releaseFiles(clean bool) error {
	parts := b.allPartitions()
	perr := closeParts(parts)
	errs := []error{perr}
	b.mu.Lock()
	logID := b.meta.LogID
	// The closed group store stays in place: readers of committed
	// offsets keep working, commits fail with ErrClosed.
	j, g, tc := b.journal, b.groups, b.txns
	b.journal, b.topics = nil, map[string]*topic{}
	b.mu.Unlock()
	if tc != nil {
		errs = append(errs, tc.close())
	}
	if j != nil {
		errs = append(errs, j.close(clean && perr == nil && b.health.Load().check() == nil))
	}
	if g != nil {
		errs = append(errs, g.close())
	}
	err := errors.Join(errs...)
	if clean && err == nil && b.health.Load().check() == nil {
		b.writeCleanClose(parts, logID)
	}
	return err
}

// shutdownLocked stops the background work and closes the files of the
// current open, if any; reopenMu must be held.
func (b *Broker) shutdownLocked(clean bool) error {
	if !b.running {
		return nil
	}
	b.running = false
	close(b.stop)
	b.wg.Wait()
	return b.releaseFiles(clean)
}

// Health reports whether the broker may acknowledge: nil while its storage
// is sound, an error wrapping ErrStorageFailed (and the I/O error) once an
// fsync failed. A relay should turn not ready with it. It stays failed
// until Reopen (or the automatic reopen, Options.ReopenInterval) opened
// the data directory again.
func (b *Broker) Health() error {
	return b.health.Load().report()
}

// Reopen closes every file of a broker whose storage failed, without
// trusting anything written since the failure, and opens the data
// directory again as Open does: torn tails cut, the journal replayed by
// rewriting everything it covers (so data the kernel may have dropped
// after the failed fsync is written and fsynced anew), producer state
// rebuilt. Appends fail with ErrStorageFailed until it succeeded. With a
// healthy broker it does nothing.
func (b *Broker) Reopen(ctx context.Context) error {
	b.reopenMu.Lock()
	defer b.reopenMu.Unlock()
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	old := b.health.Load()
	if old.check() == nil {
		return nil
	}
	b.opts.Logger.Warn("reopening the broker from disk after a storage failure", "cause", old.check())
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if err := b.shutdownLocked(false); err != nil {
		b.opts.Logger.Warn("closing files after a storage failure", "err", err)
	}
	h := newHealth(b.opts.Logger, &b.fsync)
	if err := b.start(ctx, h); err != nil {
		old.setReopenErr(fmt.Errorf("reopen: %w", err))
		return err
	}
	b.mu.Lock()
	b.health.Store(h)
	b.mu.Unlock()
	b.opts.Logger.Warn("broker reopened from disk; acknowledging again")
	return nil
}

func (b *Broker) reopenLoop() {
	defer b.loopWG.Done()
	everyTick(b.done, b.opts.ReopenInterval, func(ctx context.Context) {
		if b.health.Load().check() == nil {
			return
		}
		if err := b.Reopen(ctx); err != nil && ctx.Err() == nil {
			b.opts.Logger.Error("reopening the broker failed; will try again", "err", err)
		}
	})
}

// LogID names this data directory's log; it never changes once made.
func (b *Broker) LogID() string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.meta.LogID
}

// Sync fsyncs every partition now (useful under SyncIntervalUnsafe).
func (b *Broker) Sync() error {
	var errs []error
	for _, p := range b.allPartitions() {
		errs = append(errs, p.sync())
	}
	return errors.Join(errs...)
}

func (b *Broker) allPartitions() []*partition {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var ps []*partition
	for _, t := range b.topics {
		ps = append(ps, t.parts...)
	}
	return ps
}

func (b *Broker) syncLoop() {
	defer b.wg.Done()
	everyTick(b.stop, b.opts.SyncInterval, func(context.Context) {
		if err := b.Sync(); err != nil {
			b.opts.Logger.Error("interval fsync failed", "err", err)
		}
	})
}

// Close stops background work, fsyncs and snapshots every partition, and
// releases the data directory.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	close(b.done)
	b.loopWG.Wait()
	b.reopenMu.Lock()
	defer b.reopenMu.Unlock()
	return errors.Join(b.shutdownLocked(true), b.lock.Close())
}

func closeParts(parts []*partition) error {
	// Each close fsyncs the active segment and writes a snapshot
	// (another fsync and a directory fsync): in parallel, so that a
	// clean stop of thousands of partitions does not take thousands of
	// fsyncs one after another.
	return errors.Join(parallel(len(parts), openParallelism, func(i int) error { return parts[i].close() })...)
}

var _ io.Closer = (*Broker)(nil)
