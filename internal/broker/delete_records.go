package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// logStartFile holds, in a partition directory, the log start offset that
// DeleteRecords set, in decimal; it is replaced atomically.
const logStartFile = "log-start"

func readLogStart(fsys FS, dir string) (int64, error) {
	data, err := readFile(fsys, filepath.Join(dir, logStartFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, storageErr("read log start", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("broker: %s: %q is not an offset", filepath.Join(dir, logStartFile), data)
	}
	return n, nil
}

// logStartLocked is the first offset a fetch may ask for: the first
// segment's base, or what DeleteRecords set when that is above it (never
// above the high watermark).
func (p *partition) logStartLocked() int64 {
	return max(p.segs[0].base, min(p.startFloor, p.hw))
}

// DeleteRecords moves a partition's log start up to offset (-1: the high
// watermark), as Kafka's DeleteRecords does: records below it are no
// longer served, and whole segments below it are deleted. The new start is
// durable (the partition's log-start file, replaced atomically) before it
// returns, and is returned. An offset above the high watermark fails with
// ErrOffsetOutOfRange; one at or below the current start changes nothing.
func (b *Broker) DeleteRecords(topicName string, part int32, offset int64) (int64, error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return 0, err
	}
	if err := b.health.Load().check(); err != nil {
		return 0, err
	}
	return p.deleteRecords(offset)
}

func (p *partition) deleteRecords(offset int64) (int64, error) {
	p.cleanMu.Lock()
	defer p.cleanMu.Unlock()
	if !p.lockOpen() {
		return 0, ErrClosed
	}
	if offset == -1 {
		offset = p.hw
	}
	start := p.logStartLocked()
	if offset < 0 || offset > p.hw {
		p.mu.Unlock()
		return start, fmt.Errorf("%w: delete records before %d, log %s/%d has [%d, %d]", ErrOffsetOutOfRange, offset, p.topic, p.id, start, p.hw)
	}
	p.mu.Unlock()
	if offset <= start {
		return start, nil
	}
	if err := writeFileAtomic(p.set.fs, filepath.Join(p.dir, logStartFile), []byte(strconv.FormatInt(offset, 10)+"\n")); err != nil {
		return start, storageErr("write log start", err)
	}
	p.mu.Lock()
	p.startFloor = offset
	n := 0
	for n < len(p.segs)-1 && p.segs[n+1].base <= offset {
		n++
	}
	gone := p.segs[:n]
	p.segs = append([]*segment(nil), p.segs[n:]...)
	for _, s := range gone {
		s.deleted = true
		if s.refs == 0 {
			_ = s.closeFiles()
		}
	}
	start = p.logStartLocked()
	p.mu.Unlock()
	var errs []error
	for _, s := range gone {
		errs = append(errs, s.removeFiles(p.set.fs))
	}
	if len(gone) > 0 {
		errs = append(errs, p.set.fs.SyncDir(p.dir))
	}
	return start, storageErr("delete records", errors.Join(errs...))
}
