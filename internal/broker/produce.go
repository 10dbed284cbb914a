package broker

import (
	"context"
	"fmt"
)

// Append validates one record batch v2 (as a Produce request carries it)
// and appends it to the partition, returning the assigned base offset. The
// broker rewrites the batch's baseOffset field (bytes 0-7, outside the CRC)
// in place, so the caller must not share batch with concurrent readers.
// Under SyncBeforeAck it returns only after the batch is fsynced. Idempotent
// batches are checked against the producer's state: a duplicate of one of
// its last five batches returns the original offset with Duplicate set.
func (b *Broker) Append(ctx context.Context, topicName string, part int32, batch []byte) (AppendResult, error) {
	res, wait, err := b.AppendAsync(ctx, topicName, part, batch)
	if err != nil {
		return AppendResult{}, err
	}
	if err := wait(); err != nil {
		return AppendResult{}, err
	}
	return res, nil
}

// AppendAsync is Append split in two: it validates and writes the batch
// and returns; wait then blocks until the batch is durable under the sync
// policy (under SyncIntervalUnsafe it returns at once). The result must not
// be acknowledged before wait returned nil, and wait should always be
// called: under SyncBeforeAck the high watermark only moves over data that
// an fsync covered. Appends to a partition land in the order of their
// AppendAsync calls, so a connection can write its next request while the
// previous one's fsync runs, and concurrent waiters share fsyncs. The
// broker keeps no reference to batch once AppendAsync returns: the caller
// may reuse it.
func (b *Broker) AppendAsync(ctx context.Context, topicName string, part int32, batch []byte) (AppendResult, func() error, error) {
	return b.appendAsync(ctx, topicName, part, batch, false)
}

// appendAsync is AppendAsync; txn admits a transactional batch, which only
// ProduceTxnAsync passes after the coordinator's checks.
func (b *Broker) appendAsync(ctx context.Context, topicName string, part int32, batch []byte, txn bool) (AppendResult, func() error, error) {
	if err := ctx.Err(); err != nil {
		return AppendResult{}, nil, err
	}
	if err := b.health.Load().check(); err != nil {
		return AppendResult{}, nil, err
	}
	t, p, err := b.lookup(topicName, part, true)
	if err != nil {
		return AppendResult{}, nil, err
	}
	h, err := validateProduced(batch, t.set.config(), txn)
	if err != nil {
		return AppendResult{}, nil, err
	}
	res, target, gen, err := p.write(batch, h)
	if err != nil {
		return AppendResult{}, nil, err
	}
	if target < 0 {
		return res, noWait, nil
	}
	return res, func() error { return p.waitDurable(target, gen) }, nil
}

func noWait() error { return nil }

// ProduceAsync is AppendAsync for a batch from a Kafka client: a batch
// under a producer id reserved for the broker's own writers is refused with
// ErrReservedProducerID.
func (b *Broker) ProduceAsync(ctx context.Context, topicName string, part int32, batch []byte) (AppendResult, func() error, error) {
	if h, err := ParseBatchHeader(batch); err == nil && b.IsInternalProducer(h.ProducerID) {
		return AppendResult{}, nil, fmt.Errorf("%w: producer id %d", ErrReservedProducerID, h.ProducerID)
	}
	return b.AppendAsync(ctx, topicName, part, batch)
}

// validateProduced applies the checks a produced batch must pass before
// anything is written.
func validateProduced(batch []byte, cfg TopicConfig, txn bool) (BatchHeader, error) {
	if len(batch) > int(cfg.MaxMessageBytes) {
		return BatchHeader{}, fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLarge, len(batch), cfg.MaxMessageBytes)
	}
	h, err := VerifyBatch(batch)
	if err != nil {
		return h, err
	}
	if h.Control() || (h.Transactional() && !txn) {
		return h, ErrTransactionalUnsupported
	}
	if h.NumRecords < 1 || h.LastOffsetDelta != h.NumRecords-1 {
		return h, fmt.Errorf("%w: %d records with last offset delta %d", ErrCorruptBatch, h.NumRecords, h.LastOffsetDelta)
	}
	if h.Idempotent() && (h.ProducerEpoch < 0 || h.BaseSequence < 0) {
		return h, fmt.Errorf("%w: idempotent batch with epoch %d sequence %d", ErrCorruptBatch, h.ProducerEpoch, h.BaseSequence)
	}
	compacted := cfg.CleanupPolicy.Compacts()
	c := h.Compression()
	if c == CompressionNone {
		if !compacted {
			return h, checkUncompressedRecords(h, batch)
		}
		return h, walkRecords(h, batch[BatchHeaderSize:], true)
	}
	buf := getBodyBuffer()
	body, err := decompressTo(*buf, c, batch[BatchHeaderSize:], maxDecompressedSize)
	if err == nil {
		err = walkRecords(h, body, compacted)
	}
	putBodyBuffer(buf, body)
	return h, err
}

// ProducerState reports what the partition knows about a producer: its
// epoch and last batches. A relay restarting with a stable producer id uses
// it to continue its sequence. ok is false when the partition has no state
// for the producer (it may start at any sequence).
func (b *Broker) ProducerState(topicName string, part int32, producerID int64) (state ProducerState, ok bool, err error) {
	_, p, err := b.lookup(topicName, part, false)
	if err != nil {
		return ProducerState{}, false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.producers.state(producerID)
	return s, ok, nil
}

// ProducerID is an idempotent producer's identity.
type ProducerID struct {
	ID    int64
	Epoch int16
}

// InitProducerID allocates a producer identity, persisted before it is
// returned so ids never repeat across restarts. With an empty stableName it
// returns a fresh id at epoch 0. With a stableName (Kafka's transactional.id
// idea) the same name always maps to the same id and each call bumps the
// epoch, fencing older instances: their batches then fail with
// ErrInvalidProducerEpoch. When the epoch would overflow, the name moves to
// a fresh id at epoch 0, as Kafka does.
func (b *Broker) InitProducerID(ctx context.Context, stableName string) (ProducerID, error) {
	return b.initProducerID(ctx, stableName, false)
}

// InitInternalProducer is InitProducerID for the broker's own writers (the
// relay's sink): each call bumps the epoch of the identity named name, and
// no Kafka client can produce under that identity (Produce refuses it with
// ErrReservedProducerID), so nobody can fence it or advance its sequences.
func (b *Broker) InitInternalProducer(ctx context.Context, name string) (ProducerID, error) {
	if name == "" {
		return ProducerID{}, fmt.Errorf("%w: an internal producer needs a name", ErrInvalidConfig)
	}
	return b.initProducerID(ctx, internalPrefix+name, true)
}

// internalPrefix keeps internal producer names apart from clients'
// transactional ids.
const internalPrefix = "\x00internal/"

func (b *Broker) initProducerID(ctx context.Context, stableName string, internal bool) (ProducerID, error) {
	if err := ctx.Err(); err != nil {
		return ProducerID{}, err
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	m := b.copyMeta()
	var id ProducerID
	sp, known := m.Producers[stableName]
	switch {
	case stableName != "" && known && sp.Epoch < 1<<15-2:
		id = ProducerID{ID: sp.ID, Epoch: sp.Epoch + 1}
	default:
		id = ProducerID{ID: m.NextProducerID}
		m.NextProducerID++
	}
	if stableName != "" {
		m.Producers[stableName] = stableProducer{ID: id.ID, Epoch: id.Epoch, Internal: internal}
	}
	if err := b.saveMetaLocked(m); err != nil {
		return ProducerID{}, err
	}
	b.mu.Lock()
	b.meta = m
	b.mu.Unlock()
	return id, nil
}

// IsInternalProducer reports whether id belongs to the broker's own
// writers.
func (b *Broker) IsInternalProducer(id int64) bool {
	if id < 0 {
		return false
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, sp := range b.meta.Producers {
		if sp.Internal && sp.ID == id {
			return true
		}
	}
	return false
}
