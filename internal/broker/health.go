package broker

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// health is the broker's sticky storage state. The first failed fsync (or a
// failed truncation after a failed write, which leaves a file in an unknown
// state) fails it for good: from then on nothing is acknowledged, because
// after a failed fsync Linux may have dropped the dirty pages and a later
// fsync of the same file can succeed without them. Only reopening the
// broker from disk (which rewrites what the journal covers, see
// replayJournals) clears it, with a new health.
type health struct {
	logger *slog.Logger
	// fsyncs times every fsync (fsyncstats.go).
	fsyncs *fsyncStats
	err    atomic.Pointer[failedError]
	// failed is closed on the first failure, waking waiters.
	failed chan struct{}

	mu sync.Mutex
	// reopenErr is why the last attempt to reopen failed.
	reopenErr error
}

func newHealth(logger *slog.Logger, fsyncs *fsyncStats) *health {
	return &health{logger: logger, fsyncs: fsyncs, failed: make(chan struct{})}
}

// fail records a storage failure (the first one wins) and returns the
// error every caller sees from now on.
func (h *health) fail(op string, cause error) error {
	fe := &failedError{op: op, cause: cause}
	if h.err.CompareAndSwap(nil, fe) {
		close(h.failed)
		h.logger.Error("storage failed: acknowledgements stopped until the broker is reopened from disk",
			"op", op, "err", cause)
		return fe
	}
	return h.err.Load()
}

// check returns nil while the storage is sound.
func (h *health) check() error {
	if fe := h.err.Load(); fe != nil {
		return fe
	}
	return nil
}

// sync fsyncs f, failing the broker when it fails.
func (h *health) sync(f File, op string) error {
	if err := h.check(); err != nil {
		return err
	}
	start := time.Now()
	err := f.Sync()
	h.fsyncs.observe(fsyncFile(op), time.Since(start), op, h.logger)
	if err != nil {
		// A failed write of buffered bytes (writeback.go) dropped
		// nothing from the page cache: it fails the caller, not the
		// broker.
		if wb := (*writeBackError)(nil); errors.As(err, &wb) {
			return storageErr(op, err)
		}
		return h.fail(op, err)
	}
	return nil
}

// syncDir fsyncs a directory, failing the broker when it fails.
func (h *health) syncDir(fsys FS, dir, op string) error {
	if err := h.check(); err != nil {
		return err
	}
	start := time.Now()
	err := fsys.SyncDir(dir)
	h.fsyncs.observe(fsyncFile(op), time.Since(start), op, h.logger)
	if err != nil {
		return h.fail(op, err)
	}
	return nil
}

func (h *health) setReopenErr(err error) {
	h.mu.Lock()
	h.reopenErr = err
	h.mu.Unlock()
}

// report is what Health returns: nil, or the failure and, if a reopen was
// tried, why it failed.
func (h *health) report() error {
	err := h.check()
	if err == nil {
		return nil
	}
	h.mu.Lock()
	rerr := h.reopenErr
	h.mu.Unlock()
	if rerr != nil {
		return errors.Join(err, rerr)
	}
	return err
}
