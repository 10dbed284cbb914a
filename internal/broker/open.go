package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
)

const metaFile = "meta.json"

// Open opens (creating if needed) the broker data directory, recovering
// every partition: torn tails are cut, indexes rebuilt, producer state
// reloaded.
func Open(ctx context.Context, opts Options) (*Broker, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	if err := opts.FS.MkdirAll(filepath.Join(opts.Dir, "topics"), 0o755); err != nil {
		return nil, storageErr("create data dir", err)
	}
	lock, err := lockDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	b := &Broker{opts: opts, lock: lock, topics: map[string]*topic{}, done: make(chan struct{}), kick: make(chan struct{}, 1)}
	h := newHealth(opts.Logger, &b.fsync)
	b.health.Store(h)
	if err := b.start(ctx, h); err != nil {
		_ = lock.Close()
		return nil, err
	}
	if b.opts.ReopenInterval > 0 {
		b.loopWG.Add(1)
		go b.reopenLoop()
	}
	return b, nil
}

// start loads the data directory (recovery and journal replay included)
// with h as its storage state and starts the background work. On failure
// everything it opened is closed again.
func (b *Broker) start(ctx context.Context, h *health) error {
	b.stop = make(chan struct{})
	if err := b.load(ctx, h); err != nil {
		_ = b.releaseFiles(false)
		return err
	}
	if b.opts.Sync == SyncBeforeAck {
		j, err := openJournal(b.opts.FS, b.opts.Dir, b.opts.Logger, h, b.partitionFor)
		if err != nil {
			_ = b.releaseFiles(false)
			return err
		}
		b.mu.Lock()
		b.journal = j
		b.mu.Unlock()
		for _, p := range b.allPartitions() {
			p.set.journal = j
			p.mu.Lock()
			p.settleDamageLocked()
			p.mu.Unlock()
		}
	}
	// Transactions decided before a crash are completed now that the
	// partitions (journal replayed) take appends again.
	b.txnCoordinator().recover(ctx)
	b.running = true
	b.wg.Add(1)
	go b.txnLoop()
	if b.opts.Sync == SyncIntervalUnsafe {
		b.wg.Add(1)
		go b.syncLoop()
	}
	if b.opts.JanitorInterval > 0 {
		b.wg.Add(1)
		go b.janitorLoop()
	}
	if b.opts.ScrubBytesPerSecond > 0 {
		b.wg.Add(1)
		go b.scrubLoop()
	}
	if wb, ok := b.opts.FS.(writeBackFS); ok {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			writeBackLoop(b.stop, wb.pool)
		}()
	}
	return nil
}

// lockDir takes an exclusive flock so two daemons never write one log.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, storageErr("open lock file", err)
	}
	// A lock just released can still be held for a moment by a child
	// process forked from this one between its fork and its exec (the
	// lock belongs to the open file, which the child shares until exec
	// closes it): a refusal is retried for lockRetry before it is final.
	deadline := time.Now().Add(lockRetry)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			_ = f.Close()
			return nil, fmt.Errorf("broker: data dir %s is in use by another process: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lockRetry is how long a data directory's lock is tried again before
// the directory counts as in use.
const lockRetry = 2 * time.Second

func (b *Broker) load(ctx context.Context, h *health) error {
	m := metadata{Version: FormatVersion, NextProducerID: 1, Producers: map[string]stableProducer{}, Topics: map[string]TopicConfig{}}
	data, err := readFile(b.opts.FS, filepath.Join(b.opts.Dir, metaFile))
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("broker: parse %s: %w", metaFile, err)
		}
		if err := checkFormat(b.opts.Dir, m.Version, m.CompatibleFrom); err != nil {
			return err
		}
		if m.Producers == nil {
			m.Producers = map[string]stableProducer{}
		}
		if m.Topics == nil {
			m.Topics = map[string]TopicConfig{}
		}
	case errors.Is(err, os.ErrNotExist):
	default:
		return storageErr("read metadata", err)
	}
	if m.LogID == "" {
		m.LogID = uuid.NewString()
		if err := b.saveMetaLocked(m); err != nil {
			return err
		}
	}
	b.mu.Lock()
	b.meta = m
	b.deleted = nil
	b.mu.Unlock()
	// What DeleteTopic moved aside and a crash left behind.
	_ = removeAll(b.opts.FS, filepath.Join(b.opts.Dir, "deleted"))
	// The clean-close manifest is taken (read and removed) before any
	// partition opens: see cleanclose.go.
	clean, err := takeCleanClose(b.opts.FS, b.opts.Dir, m.LogID, h, b.opts.Logger)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(m.Topics))
	for n := range m.Topics {
		names = append(names, n)
	}
	sort.Strings(names)
	// Topics open in parallel too, each of its partitions as openTopic
	// says: a data directory of a thousand small topics is mostly
	// directory fsyncs and file opens.
	opened := make([]*topic, len(names))
	errs := parallel(len(names), openParallelism, func(i int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		opened[i], err = b.openTopic(names[i], m.Topics[names[i]], h, true, clean)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		for _, t := range opened {
			if t != nil {
				for _, q := range t.parts {
					_ = q.close()
				}
			}
		}
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	b.mu.Lock()
	for i, t := range opened {
		b.topics[names[i]] = t
	}
	b.mu.Unlock()
	gs, err := openGroupStore(b.opts.FS, filepath.Join(b.opts.Dir, "groups"), b.opts.OffsetsCompactBytes, b.opts.Logger, h)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.groups = gs
	b.mu.Unlock()
	tc, err := openTxnCoordinator(b, h)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.txns = tc
	b.mu.Unlock()
	return nil
}

// openParallelism is how many partitions of a topic, and how many
// topics, open at once; and how many partitions close at once.
const openParallelism = 16

// parallel runs fn(0) .. fn(n-1) on at most workers goroutines and
// returns their errors by index.
func parallel(n, workers int, fn func(i int) error) []error {
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < min(n, workers); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				errs[i] = fn(i)
			}
		}()
	}
	wg.Wait()
	return errs
}

// openTopic opens a topic's partitions; known says meta.json lists it, so
// a missing partition directory is lost data, not a new partition. clean
// is the clean-close manifest (nil without one).
func (b *Broker) openTopic(name string, cfg TopicConfig, h *health, known bool, clean map[partitionKey]*cleanEntry) (*topic, error) {
	set := &partitionSettings{
		health:             h,
		allowLost:          b.opts.AllowLostPartitions,
		fs:                 b.opts.FS,
		syncBeforeAck:      b.opts.Sync == SyncBeforeAck,
		indexInterval:      b.opts.IndexIntervalBytes,
		maxOpenReaders:     b.opts.MaxOpenSegmentReaders,
		compactionMapBytes: b.opts.CompactionMapBytes,
		now:                b.opts.Now,
		logger:             b.opts.Logger,
		journal:            b.journal,
	}
	set.cfg.Store(&cfg)
	t := &topic{name: name, set: set}
	// Partitions open in parallel: each has its own directory and files,
	// and an open is mostly waiting on the disk (a directory fsync, the
	// active segment's read), so a topic of thousands of partitions opens
	// and is created in a fraction of the time one at a time takes.
	parts := make([]*partition, cfg.Partitions)
	errs := parallel(int(cfg.Partitions), openParallelism, func(i int) error {
		var err error
		parts[i], err = openPartition(set, partitionDir(b.opts.Dir, name, int32(i)), name, int32(i), known, clean[partitionKey{name, int32(i)}])
		return err
	})
	for i, err := range errs {
		if err != nil {
			for _, q := range parts {
				if q != nil {
					_ = q.close()
				}
			}
			return nil, fmt.Errorf("open %s/%d: %w", name, i, err)
		}
	}
	t.parts = parts
	if !known {
		// The directories must be durable before meta.json lists the
		// topic: a partition directory missing later is lost data. The
		// caller fsyncs DIR/topics, once for all the topics it creates.
		if err := h.syncDir(b.opts.FS, filepath.Dir(partitionDir(b.opts.Dir, name, 0)), "fsync topic dir"); err != nil {
			t.closeParts()
			return nil, err
		}
	}
	return t, nil
}

// syncTopicsDir fsyncs DIR/topics, making new topic directories durable.
func (b *Broker) syncTopicsDir(h *health) error {
	return h.syncDir(b.opts.FS, filepath.Join(b.opts.Dir, "topics"), "fsync topics dir")
}

func partitionDir(dataDir, topic string, p int32) string {
	return filepath.Join(dataDir, "topics", topic, strconv.Itoa(int(p)))
}

// saveMetaLocked persists b.meta atomically; metaMu must be held.
func (b *Broker) saveMetaLocked(m metadata) error {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("broker: encode metadata: %w", err)
	}
	return storageErr("write metadata", writeFileAtomic(b.opts.FS, filepath.Join(b.opts.Dir, metaFile), data))
}
