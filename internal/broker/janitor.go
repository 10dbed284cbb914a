package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"
)

// janitorLoop runs retention and compaction every JanitorInterval, and
// at once after a topic's configuration changed (kickJanitor), so that a
// shorter retention or a new policy takes effect without waiting for the
// next tick.
func (b *Broker) janitorLoop() {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-b.stop
		cancel()
	}()
	tick := time.NewTicker(b.opts.JanitorInterval)
	defer tick.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-tick.C:
		case <-b.kick:
		}
		if err := b.EnforceRetention(ctx); err != nil && ctx.Err() == nil {
			b.opts.Logger.Error("retention failed", "err", err)
		}
		if err := b.Compact(ctx); err != nil && ctx.Err() == nil {
			b.opts.Logger.Error("compaction failed", "err", err)
		}
		b.janitorPasses.Add(1)
	}
}

// KickJanitor asks the background janitor for a retention and compaction
// pass now (a no-op when it is disabled or a pass is already asked for).
func (b *Broker) KickJanitor() { b.kickJanitor() }

func (b *Broker) kickJanitor() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// JanitorPasses is the number of retention and compaction passes the
// background janitor finished since Open.
func (b *Broker) JanitorPasses() int64 { return b.janitorPasses.Load() }

// everyTick calls fn at every interval until stop is closed, with a context
// cancelled when stop closes, so that a call in progress ends early.
func everyTick(stop <-chan struct{}, interval time.Duration, fn func(ctx context.Context)) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			fn(ctx)
		}
	}
}

func (b *Broker) topicList() []*topic {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return slices.Collect(maps.Values(b.topics))
}

// EnforceRetention deletes whole inactive segments of delete-policy topics
// that are past their topic's retention time or beyond its retention size,
// advancing each log start offset. The janitor calls it periodically.
func (b *Broker) EnforceRetention(ctx context.Context) error {
	return b.eachPartitionOf(ctx, CleanupPolicy.Deletes, func(p *partition, now int64) error { return p.enforceRetention(now) })
}

// Compact cleans every partition of compact-policy topics. The janitor calls
// it periodically.
func (b *Broker) Compact(ctx context.Context) error {
	return b.eachPartitionOf(ctx, CleanupPolicy.Compacts, func(p *partition, now int64) error { return p.compact(ctx, now) })
}

// eachPartitionOf runs clean on every partition of the topics whose
// cleanup policy has, with the time in milliseconds, and joins the
// failures. It stops when ctx ends, with ctx's error.
func (b *Broker) eachPartitionOf(ctx context.Context, has func(CleanupPolicy) bool, clean func(p *partition, nowMs int64) error) error {
	var errs []error
	now := b.opts.Now().UnixMilli()
	for _, t := range b.topicList() {
		if !has(t.set.config().CleanupPolicy) {
			continue
		}
		for _, p := range t.parts {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := clean(p, now); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				errs = append(errs, fmt.Errorf("%s/%d: %w", t.name, p.id, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (p *partition) enforceRetention(nowMs int64) error {
	p.cleanMu.Lock()
	defer p.cleanMu.Unlock()
	cfg := p.set.config()
	if !p.lockOpen() {
		return ErrClosed
	}
	var total int64
	for _, s := range p.segs {
		total += s.size
	}
	// A segment goes only when it ends at or below the last stable
	// offset: the data of an open transaction stays until it ends.
	lso := p.txns.stable(p.hw)
	n := 0
	for n < len(p.segs)-1 && p.segs[n+1].base <= lso {
		s := p.segs[n]
		expired := cfg.RetentionMs >= 0 && s.maxTS < nowMs-cfg.RetentionMs
		oversize := cfg.RetentionBytes >= 0 && total-s.size >= cfg.RetentionBytes
		if !expired && !oversize {
			break
		}
		total -= s.size
		n++
	}
	gone := p.segs[:n]
	p.segs = append([]*segment(nil), p.segs[n:]...)
	p.txns.prune(p.segs[0].base)
	for _, s := range gone {
		s.deleted = true
		if s.refs == 0 {
			_ = s.closeFiles()
		}
	}
	p.mu.Unlock()
	if len(gone) == 0 {
		return nil
	}
	var errs []error
	for _, s := range gone {
		errs = append(errs, s.removeFiles(p.set.fs))
	}
	errs = append(errs, p.set.fs.SyncDir(p.dir))
	p.set.logger.Info("retention deleted segments", "topic", p.topic, "partition", p.id, "segments", len(gone))
	return storageErr("retention", errors.Join(errs...))
}

// compact keeps only the newest record per key in the cleanable segments,
// preserving offsets: the inactive segments up to the first whose newest
// record is younger than min.compaction.lag.ms (which, and everything after
// it, stays as written, and does not shadow older records). The active
// segment is never touched. Tombstones older than delete.retention.ms are
// dropped. A batch that is some producer's last known batch is kept (even
// emptied of records) so idempotence state still rebuilds from the log.
//
// The keys are tracked in an offsetMap of at most
// Options.CompactionMapBytes (about 27 bytes per key). When the keys do not
// fit, compaction runs in passes, as Kafka's cleaner does: a pass fills the
// map from where the previous one stopped up to the batch that does not
// fit (end), then cleans every segment below end: a record below end goes
// when the map holds a newer offset of its key (or, at or above where the
// map starts, holds it not at all: an aborted record), a tombstone below
// end when old enough; records from end on stay for the next pass.
func (p *partition) compact(ctx context.Context, nowMs int64) error {
	p.cleanMu.Lock()
	defer p.cleanMu.Unlock()
	if !p.lockOpen() {
		return ErrClosed
	}
	if len(p.lost) > 0 {
		// Rewriting segments would drop the damaged bytes kept in place
		// and shift the positions lost.json names.
		p.mu.Unlock()
		return nil
	}
	// Only segments below the last stable offset: an open transaction's
	// records may still be aborted, so they cannot shadow older values.
	lso := p.txns.stable(p.hw)
	lagCutoff := nowMs - p.set.config().MinCompactionLagMs
	var segs []*segment
	for i, s := range p.segs[:len(p.segs)-1] {
		if p.segs[i+1].base > lso || p.set.config().MinCompactionLagMs > 0 && s.maxTS >= lagCutoff {
			break
		}
		segs = append(segs, s)
	}
	var segsEnd int64
	if len(segs) > 0 {
		segsEnd = p.segs[len(segs)].base
	}
	txns := p.txns.clone()
	keepBatch := map[int64]bool{}
	for _, e := range p.producers {
		if len(e.batches) > 0 {
			keepBatch[e.batches[len(e.batches)-1].FirstOffset] = true
		}
	}
	p.mu.Unlock()
	if len(segs) == 0 {
		return nil
	}
	tombstoneCutoff := nowMs - p.set.config().DeleteRetentionMs
	m, err := newOffsetMap(p.set.compactionMapBytes)
	if err != nil {
		return err
	}
	defer m.free()
	start := segs[0].base
	for pass := 1; ; pass++ {
		end, err := p.fillOffsetMap(ctx, segs, segsEnd, start, m, txns)
		if err != nil {
			return err
		}
		for _, s := range segs {
			if s.base >= end {
				break
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := p.cleanSegment(s, m, start, end, keepBatch, tombstoneCutoff); err != nil {
				return err
			}
		}
		if end >= segsEnd {
			if pass > 1 {
				p.set.logger.Info("compaction took several passes: the keys did not fit the key map (CompactionMapBytes)",
					"topic", p.topic, "partition", p.id, "passes", pass)
			}
			return nil
		}
		// The cleaned segments replaced the ones in segs, at the same
		// places (cleanMu keeps retention out meanwhile).
		p.mu.Lock()
		segs = append(segs[:0:0], p.segs[:len(segs)]...)
		p.mu.Unlock()
		start = end
		m.reset()
	}
}

// errMapFull stops fillOffsetMap's scan at the batch that does not fit.
var errMapFull = errors.New("compaction key map full")

// fillOffsetMap records in m the newest offset of each key of the records
// at or above start in segs (whose offsets end before segsEnd), up to the
// first batch that does not fit, and returns where it stopped: that
// batch's base offset, or segsEnd. Control batches and aborted records
// are left out: markers have keys of their own, and an aborted record must
// not hide the committed value before it.
func (p *partition) fillOffsetMap(ctx context.Context, segs []*segment, segsEnd, start int64, m *offsetMap, txns txnIndex) (int64, error) {
	end := segsEnd
	for i, s := range segs {
		if i+1 < len(segs) && segs[i+1].base <= start {
			continue
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		err := p.scanSegmentRecords(s, func(h BatchHeader, _ []byte, recs []Record) error {
			if h.LastOffset() < start || h.Control() || (h.Transactional() && txns.isAborted(h.ProducerID, h.BaseOffset)) {
				return nil
			}
			if ok, err := m.room(len(recs)); err != nil || !ok {
				end = h.BaseOffset
				return cmp.Or(err, errMapFull)
			}
			for _, r := range recs {
				m.put(hashKey(r.Key), r.Offset)
			}
			return nil
		})
		if errors.Is(err, errMapFull) {
			return end, nil
		}
		if err != nil {
			return 0, err
		}
	}
	return end, nil
}

func (p *partition) scanSegmentRecords(s *segment, fn func(h BatchHeader, b []byte, recs []Record) error) error {
	f, err := p.set.fs.OpenFile(segmentName(p.dir, s.base, logSuffix), os.O_RDONLY, 0)
	if err != nil {
		return storageErr("open segment for compaction", err)
	}
	defer f.Close()
	_, err = scanBatches(f, 0, s.size, true, func(h BatchHeader, _ int64, b []byte) error {
		recs, err := decodeRecords(h, b, maxDecompressedSize)
		if err != nil {
			return err
		}
		return fn(h, b, recs)
	})
	if err != nil {
		return fmt.Errorf("compaction scan of segment %d: %w", s.base, err)
	}
	return nil
}

// cleanSegment writes the surviving batches of s to a .cleaned file and
// swaps it in. The index files are removed before the rename and written
// after it, so a crash in between leaves no index that disagrees with its
// log: missing indexes are rebuilt on open.
func (p *partition) cleanSegment(s *segment, m *offsetMap, start, end int64, keepBatch map[int64]bool, tombstoneCutoff int64) error {
	fsys := p.set.fs
	cleanedPath := segmentName(p.dir, s.base, logSuffix+cleanedSuffix)
	out, err := fsys.OpenFile(cleanedPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return storageErr("create cleaned segment", err)
	}
	ns := &segment{dir: p.dir, base: s.base, maxTS: -1, loaded: true}
	changed := false
	err = p.scanSegmentRecords(s, func(h BatchHeader, b []byte, recs []Record) error {
		if h.Control() {
			// Kept for good: a read_committed consumer needs the marker
			// that ends a transaction whose records it is skipping.
			ns.noteBatch(h, ns.size, p.set.indexInterval)
			if _, err := out.Write(b); err != nil {
				return storageErr("write cleaned segment", err)
			}
			ns.size += int64(len(b))
			return nil
		}
		var kept []Record
		var deltas []int32
		for _, r := range recs {
			if r.Offset < end {
				if off, ok := m.get(hashKey(r.Key)); ok && off != r.Offset || !ok && r.Offset >= start {
					continue
				}
				if r.Value == nil && h.MaxTimestamp < tombstoneCutoff {
					continue
				}
			}
			kept = append(kept, r)
			deltas = append(deltas, int32(r.Offset-h.BaseOffset))
		}
		data := b
		if len(kept) != len(recs) {
			changed = true
			if len(kept) == 0 && !keepBatch[h.BaseOffset] {
				return nil
			}
			var err error
			data, err = appendBatchWithDeltas(nil, BatchOptions{
				ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch, BaseSequence: h.BaseSequence,
				Compression: h.Compression(), BaseOffset: h.BaseOffset, logAppendTime: h.Attributes&attrLogAppendTime != 0,
				transactional: h.Transactional(),
			}, kept, deltas, h.LastOffsetDelta, h.BaseTimestamp, h.MaxTimestamp, true)
			if err != nil {
				return err
			}
		}
		ns.noteBatch(h, ns.size, p.set.indexInterval)
		if _, err := out.Write(data); err != nil {
			return storageErr("write cleaned segment", err)
		}
		ns.size += int64(len(data))
		return nil
	})
	if err == nil && changed {
		err = p.set.health.sync(out, "fsync cleaned segment")
	}
	if cerr := out.Close(); err == nil {
		err = storageErr("close cleaned segment", cerr)
	}
	if err != nil || !changed {
		_ = fsys.Remove(cleanedPath)
		return err
	}
	for _, suf := range []string{indexSuffix, timeIndexSuffix} {
		if err := fsys.Remove(segmentName(p.dir, s.base, suf)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return storageErr("remove stale index", err)
		}
	}
	if err := fsys.Rename(cleanedPath, segmentName(p.dir, s.base, logSuffix)); err != nil {
		return storageErr("swap in cleaned segment", err)
	}
	if err := fsys.SyncDir(p.dir); err != nil {
		return storageErr("fsync partition dir", err)
	}
	if err := writeIndexFiles(fsys, ns); err != nil {
		return err
	}
	ns.idx, ns.tidx, ns.loaded = nil, nil, false
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, c := range p.segs {
		if c == s {
			segs := append([]*segment(nil), p.segs...)
			segs[i] = ns
			p.segs = segs
			break
		}
	}
	s.deleted = true
	if s.refs == 0 {
		_ = s.closeFiles()
	}
	return nil
}
