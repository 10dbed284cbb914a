package broker

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// The scrubber reads every segment of every partition in the background,
// batch by batch, and checks each batch's CRC, so damage in data nobody
// reads (an old inactive segment) is found and reported before a consumer
// needs it. It runs pass after pass at Options.ScrubBytesPerSecond, with
// Options.ScrubPause before the first pass and between passes.

// scrubStats are the background check's counters.
type scrubStats struct {
	passes  atomic.Int64
	bytes   atomic.Int64
	lastEnd atomic.Int64 // unix ms of the last completed pass
}

// ScrubReport is what one pass of the check did.
type ScrubReport struct {
	Batches int64
	Bytes   int64
	// Lost are the damaged ranges the pass found that were not known
	// before.
	Lost int
}

// ScrubStatus is the background check's progress.
type ScrubStatus struct {
	Passes       int64
	BytesChecked int64
	LastPassEnd  time.Time
}

// ScrubStatus reports the background check's progress.
func (b *Broker) ScrubStatus() ScrubStatus {
	st := ScrubStatus{Passes: b.scrub.passes.Load(), BytesChecked: b.scrub.bytes.Load()}
	if ms := b.scrub.lastEnd.Load(); ms > 0 {
		st.LastPassEnd = time.UnixMilli(ms)
	}
	return st
}

// throttle paces reads at rate bytes per second (0: unpaced).
type throttle struct {
	rate  int64
	start time.Time
	bytes int64
	stop  <-chan struct{}
}

// take accounts n bytes and sleeps until the rate allows them; false when
// stopped meanwhile.
func (t *throttle) take(ctx context.Context, n int64) bool {
	if t.rate <= 0 {
		return ctx.Err() == nil
	}
	t.bytes += n
	want := time.Duration(float64(t.bytes) / float64(t.rate) * float64(time.Second))
	wait := want - time.Since(t.start)
	if wait < 10*time.Millisecond {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	case <-t.stop:
		return false
	}
}

// Scrub runs one unpaced pass of the background check over every segment
// of every partition, reporting damaged batches as lost (ERROR log,
// PartitionInfo.Lost, lost.json) like a read that meets them.
func (b *Broker) Scrub(ctx context.Context) (ScrubReport, error) {
	return b.scrubPass(ctx, &throttle{start: time.Now()})
}

func (b *Broker) scrubPass(ctx context.Context, th *throttle) (ScrubReport, error) {
	var rep ScrubReport
	for _, t := range b.topicList() {
		for _, p := range t.parts {
			if err := p.scrub(ctx, th, &rep); err != nil {
				if errors.Is(err, ErrClosed) {
					continue
				}
				return rep, err
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
	}
	b.scrub.passes.Add(1)
	b.scrub.bytes.Add(rep.Bytes)
	b.scrub.lastEnd.Store(time.Now().UnixMilli())
	return rep, nil
}

func (b *Broker) scrubLoop() {
	defer b.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := b.stop
	go func() {
		<-stop
		cancel()
	}()
	for {
		// The first pass waits too: an open is followed by the catch-up
		// of whatever queued while the broker was down, and at thousands
		// of partitions a pass's per-batch reads took a few percent of
		// the CPU that catch-up had.
		timer := time.NewTimer(b.opts.ScrubPause)
		select {
		case <-stop:
			timer.Stop()
			return
		case <-timer.C:
		}
		th := &throttle{rate: b.opts.ScrubBytesPerSecond, start: time.Now(), stop: stop}
		rep, err := b.scrubPass(ctx, th)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.opts.Logger.Error("background check failed", "err", err)
		} else if rep.Lost > 0 {
			b.opts.Logger.Error("background check found damaged batches", "ranges", rep.Lost, "bytes_checked", rep.Bytes)
		}
	}
}

// scrub checks every batch of every segment of p up to the high
// watermark.
func (p *partition) scrub(ctx context.Context, th *throttle, rep *ScrubReport) error {
	p.mu.Lock()
	n := len(p.segs)
	p.mu.Unlock()
	for i := 0; i < n; i++ {
		if !p.lockOpen() {
			return ErrClosed
		}
		if i >= len(p.segs) {
			p.mu.Unlock()
			return nil
		}
		s := p.segs[i]
		limit, end := s.size, p.segmentEndLocked(i)
		if i == len(p.segs)-1 {
			limit, end = p.hwPos, p.hw
		}
		if err := p.ensureOpenLocked(s); err != nil {
			p.mu.Unlock()
			return err
		}
		p.pinLocked(s)
		p.mu.Unlock()
		ok := p.scrubSegment(ctx, th, s, limit, end, rep)
		p.unpin(s)
		if !ok {
			return ctx.Err()
		}
	}
	return nil
}

// scrubChunkBytes is how much of a segment the background check reads at
// once.
const scrubChunkBytes = 256 << 10

// scrubSegment checks the batches of s in [0, limit); false when stopped.
func (p *partition) scrubSegment(ctx context.Context, th *throttle, s *segment, limit, end int64, rep *ScrubReport) bool {
	// The segment is read in chunks of scrubChunkBytes, not two reads a
	// batch: with small batches the reads cost more than the checks.
	var chunk []byte
	chunkPos := int64(-1)
	read := func(pos int64, n int) ([]byte, error) {
		if chunkPos >= 0 && pos >= chunkPos && pos+int64(n) <= chunkPos+int64(len(chunk)) {
			return chunk[pos-chunkPos : pos-chunkPos+int64(n)], nil
		}
		size := int(min(max(int64(n), scrubChunkBytes), limit-pos))
		if cap(chunk) < size {
			chunk = make([]byte, size)
		}
		chunk, chunkPos = chunk[:size], -1
		if _, err := s.log.ReadAt(chunk, pos); err != nil {
			return nil, err
		}
		chunkPos = pos
		return chunk[:n], nil
	}
	pos, first := int64(0), s.base
	for pos < limit {
		p.mu.Lock()
		skip, deleted := skipAt(s.damaged, pos), s.deleted
		if skip > 0 {
			for _, r := range p.lost {
				if r.Segment == s.base && r.Pos == pos {
					first = max(first, r.Last+1)
				}
			}
		}
		p.mu.Unlock()
		if deleted {
			return true
		}
		if skip > 0 {
			pos += skip
			continue
		}
		var bad error
		var h BatchHeader
		if limit-pos < BatchHeaderSize {
			bad = ErrCorruptBatch
		} else if hdr, err := read(pos, BatchHeaderSize); err != nil {
			p.readFailed(s, pos, err)
			return true
		} else if h, bad = ParseBatchHeader(hdr); bad == nil && int64(h.Size()) > limit-pos {
			bad = ErrCorruptBatch
		}
		if bad == nil {
			b, err := read(pos, h.Size())
			if err != nil {
				p.readFailed(s, pos, err)
				return true
			}
			_, bad = VerifyBatch(b)
		}
		if bad != nil {
			size, last := locateDamage(s.log, pos, limit, first, end)
			p.mu.Lock()
			if !s.deleted {
				before := len(p.lost)
				p.recordLostLocked(LostRange{First: first, Last: last, Segment: s.base, Pos: pos, Size: size,
					Reason: "damaged batch found by the background check: " + bad.Error()})
				if len(p.lost) > before {
					rep.Lost++
				}
			}
			p.mu.Unlock()
			pos, first = pos+size, last+1
			continue
		}
		rep.Batches++
		rep.Bytes += int64(h.Size())
		pos += int64(h.Size())
		first = h.LastOffset() + 1
		if !th.take(ctx, int64(h.Size())) {
			return false
		}
	}
	return true
}

// readFailed logs a read error of the background check: the disk did not
// answer, which says nothing yet about the bytes; the next pass tries
// again.
func (p *partition) readFailed(s *segment, pos int64, err error) {
	p.set.logger.Error("background check could not read a segment", "topic", p.topic, "partition", p.id,
		"segment", s.base, "pos", pos, "err", err)
}
