package broker

import (
	"context"
	"time"
)

// Fetch returns whole batches starting with the one holding offset, up to
// maxBytes (but always at least one batch), never past the high watermark.
// An offset equal to the high watermark yields no batches; outside [log
// start, high watermark] it fails with ErrOffsetOutOfRange. Fetch does not
// wait; combine it with Wait or Watch.
func (b *Broker) Fetch(ctx context.Context, topicName string, part int32, offset int64, maxBytes int) (FetchResult, error) {
	return b.FetchInto(ctx, topicName, part, offset, maxBytes, nil)
}

// FetchInto is Fetch reading into buf's backing array when it is large
// enough (into a new one otherwise), so that a caller can recycle its read
// buffers: the result's Batches may alias buf.
func (b *Broker) FetchInto(ctx context.Context, topicName string, part int32, offset int64, maxBytes int, buf []byte) (FetchResult, error) {
	return b.fetchInto(ctx, topicName, part, offset, maxBytes, buf, false)
}

// FetchCommittedInto is FetchInto for a read_committed consumer: it
// returns nothing at or past the last stable offset (no record of an open
// transaction) and lists the aborted transactions among the batches, which
// the consumer skips.
func (b *Broker) FetchCommittedInto(ctx context.Context, topicName string, part int32, offset int64, maxBytes int, buf []byte) (FetchResult, error) {
	return b.fetchInto(ctx, topicName, part, offset, maxBytes, buf, true)
}

// fetchInto is FetchInto, and with committed FetchCommittedInto.
func (b *Broker) fetchInto(ctx context.Context, topicName string, part int32, offset int64, maxBytes int, buf []byte, committed bool) (FetchResult, error) {
	if err := ctx.Err(); err != nil {
		return FetchResult{}, err
	}
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return FetchResult{}, err
	}
	return p.fetch(offset, maxBytes, buf, committed)
}

// LastStableOffset is the partition's last stable offset: the first offset
// of its oldest open transaction, or the high watermark.
func (b *Broker) LastStableOffset(topicName string, part int32) (int64, error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.txns.stable(p.hw), nil
}

// Watch returns a channel closed the next time the partition's high
// watermark moves (or the broker closes), so a listener can wait on many
// partitions in one select.
func (b *Broker) Watch(topicName string, part int32) (<-chan struct{}, error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.watchLocked(), nil
}

// Wait blocks until the high watermark is above offset (data to fetch at
// offset) or ctx ends.
func (b *Broker) Wait(ctx context.Context, topicName string, part int32, offset int64) error {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return err
	}
	for {
		h := b.health.Load()
		if err := h.check(); err != nil {
			return err
		}
		p.mu.Lock()
		hw, ch, closed := p.hw, p.watchLocked(), p.closed
		p.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if hw > offset {
			return nil
		}
		select {
		case <-ch:
		case <-h.failed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Offsets returns the log start offset (earliest) and the high watermark
// (latest) of a partition.
func (b *Broker) Offsets(topicName string, part int32) (earliest, latest int64, err error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return 0, 0, err
	}
	info := p.info()
	return info.LogStartOffset, info.HighWatermark, nil
}

// OffsetForTime returns the offset and timestamp of the first record whose
// timestamp is at or after ts, using the time index; -1, -1 when no record
// is that recent (as Kafka's ListOffsets answers).
func (b *Broker) OffsetForTime(topicName string, part int32, ts time.Time) (offset, timestamp int64, err error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return 0, 0, err
	}
	return p.offsetForTime(ts.UnixMilli())
}
