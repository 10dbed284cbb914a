package broker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sort"
)

// producerBatchesKept is how many recent batches per producer and partition
// are remembered for duplicate detection; Kafka keeps five, matching the
// clients' limit of five in-flight requests per connection.
const producerBatchesKept = 5

// ProducerBatch describes one appended batch of an idempotent producer.
type ProducerBatch struct {
	FirstSeq     int32
	LastSeq      int32
	FirstOffset  int64
	LastOffset   int64
	MaxTimestamp int64
}

// ProducerState is what a partition knows about one producer: its current
// epoch and its most recent batches, oldest first. A producer restarting with
// a stable id continues at LastSequence()+1.
type ProducerState struct {
	ProducerID int64
	Epoch      int16
	Batches    []ProducerBatch
}

// LastSequence is the last sequence the partition accepted from the
// producer, or -1 when it has none.
func (s ProducerState) LastSequence() int32 {
	if len(s.Batches) == 0 {
		return -1
	}
	return s.Batches[len(s.Batches)-1].LastSeq
}

// LastOffset is the offset of the producer's last appended record, or -1.
func (s ProducerState) LastOffset() int64 {
	if len(s.Batches) == 0 {
		return -1
	}
	return s.Batches[len(s.Batches)-1].LastOffset
}

type producerEntry struct {
	epoch   int16
	batches []ProducerBatch
}

// producerTable is the idempotence state of one partition.
type producerTable map[int64]*producerEntry

// check applies Kafka's validation order to a batch. A duplicate returns the
// cached batch and ok=true with a nil error.
func (t producerTable) check(h BatchHeader) (dup *ProducerBatch, err error) {
	if !h.Idempotent() {
		return nil, nil
	}
	e := t[h.ProducerID]
	if e == nil {
		return nil, nil
	}
	if h.Control() {
		// A marker carries no sequence; only its epoch is checked.
		if h.ProducerEpoch < e.epoch {
			return nil, fmt.Errorf("%w: marker of producer %d epoch %d, current %d", ErrInvalidProducerEpoch, h.ProducerID, h.ProducerEpoch, e.epoch)
		}
		return nil, nil
	}
	last := h.LastSequence()
	if h.ProducerEpoch == e.epoch {
		for i := range e.batches {
			b := &e.batches[i]
			if b.FirstSeq == h.BaseSequence && b.LastSeq == last {
				return b, nil
			}
		}
	}
	switch {
	case h.ProducerEpoch < e.epoch:
		return nil, fmt.Errorf("%w: producer %d epoch %d, current %d", ErrInvalidProducerEpoch, h.ProducerID, h.ProducerEpoch, e.epoch)
	case h.ProducerEpoch > e.epoch:
		if h.BaseSequence != 0 {
			return nil, fmt.Errorf("%w: producer %d new epoch %d must start at sequence 0, got %d", ErrOutOfOrderSequence, h.ProducerID, h.ProducerEpoch, h.BaseSequence)
		}
	default:
		if len(e.batches) > 0 {
			want := addSeq(e.batches[len(e.batches)-1].LastSeq, 1)
			if h.BaseSequence != want {
				return nil, fmt.Errorf("%w: producer %d epoch %d expected sequence %d, got %d", ErrOutOfOrderSequence, h.ProducerID, h.ProducerEpoch, want, h.BaseSequence)
			}
		}
	}
	return nil, nil
}

// update records an appended (or replayed) batch.
func (t producerTable) update(h BatchHeader) {
	if !h.Idempotent() {
		return
	}
	e := t[h.ProducerID]
	if e == nil {
		e = &producerEntry{epoch: h.ProducerEpoch}
		t[h.ProducerID] = e
	}
	if h.ProducerEpoch != e.epoch {
		e.epoch = h.ProducerEpoch
		e.batches = e.batches[:0]
	}
	if h.Control() {
		// A marker moves the epoch (a fencing abort bumps it) and ends
		// the transaction; the sequence continues past it.
		return
	}
	if len(e.batches) == producerBatchesKept {
		copy(e.batches, e.batches[1:])
		e.batches = e.batches[:producerBatchesKept-1]
	}
	e.batches = append(e.batches, ProducerBatch{
		FirstSeq:     h.BaseSequence,
		LastSeq:      h.LastSequence(),
		FirstOffset:  h.BaseOffset,
		LastOffset:   h.LastOffset(),
		MaxTimestamp: h.MaxTimestamp,
	})
}

func (t producerTable) state(id int64) (ProducerState, bool) {
	e := t[id]
	if e == nil {
		return ProducerState{}, false
	}
	return ProducerState{ProducerID: id, Epoch: e.epoch, Batches: append([]ProducerBatch(nil), e.batches...)}, true
}

// Snapshot file: "RLPS" | u16 version 2 | i64 offset | u32 producer count |
// per producer: i64 id, i16 epoch, u8 n, n × (i32 firstSeq, i32 lastSeq,
// i64 firstOffset, i64 lastOffset, i64 maxTimestamp) | version 2 only:
// per producer i64 first offset of its open transaction (-1: none), u32
// aborted count, per aborted transaction i64 producer id, i64 first, i64
// last | u32 CRC32C of all preceding bytes. Version 1 (no transactions)
// is still read.
var snapshotMagic = []byte("RLPS")

const (
	snapshotVersion   = 2
	snapshotBatchSize = 4 + 4 + 8 + 8 + 8
)

func encodeSnapshot(offset int64, t producerTable, x txnIndex) []byte {
	for id := range x.open {
		if t[id] == nil {
			// Every open transaction's producer has an entry; keep the
			// snapshot whole should that ever not hold.
			t[id] = &producerEntry{}
		}
	}
	ids := make([]int64, 0, len(t))
	for id := range t {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	b := append([]byte(nil), snapshotMagic...)
	b = binary.BigEndian.AppendUint16(b, snapshotVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(offset))
	b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		e := t[id]
		b = binary.BigEndian.AppendUint64(b, uint64(id))
		b = binary.BigEndian.AppendUint16(b, uint16(e.epoch))
		b = append(b, byte(len(e.batches)))
		for _, pb := range e.batches {
			b = binary.BigEndian.AppendUint32(b, uint32(pb.FirstSeq))
			b = binary.BigEndian.AppendUint32(b, uint32(pb.LastSeq))
			b = binary.BigEndian.AppendUint64(b, uint64(pb.FirstOffset))
			b = binary.BigEndian.AppendUint64(b, uint64(pb.LastOffset))
			b = binary.BigEndian.AppendUint64(b, uint64(pb.MaxTimestamp))
		}
	}
	b = appendTxnSnapshot(b, ids, x)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errBadSnapshot = errors.New("broker: invalid producer snapshot")

func decodeSnapshot(b []byte) (int64, producerTable, txnIndex, error) {
	x := newTxnIndex()
	if len(b) < 4+2+8+4+4 || string(b[:4]) != string(snapshotMagic) {
		return 0, nil, x, errBadSnapshot
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	version := binary.BigEndian.Uint16(body[4:])
	if crc32.Checksum(body, castagnoli) != sum || (version != 1 && version != snapshotVersion) {
		return 0, nil, x, errBadSnapshot
	}
	offset := int64(binary.BigEndian.Uint64(body[6:]))
	n := binary.BigEndian.Uint32(body[14:])
	body = body[18:]
	t := make(producerTable, min(int(n), len(body)/11))
	ids := make([]int64, 0, min(int(n), len(body)/11))
	for i := uint32(0); i < n; i++ {
		if len(body) < 11 {
			return 0, nil, x, errBadSnapshot
		}
		id := int64(binary.BigEndian.Uint64(body))
		e := &producerEntry{epoch: int16(binary.BigEndian.Uint16(body[8:]))}
		nb := int(body[10])
		body = body[11:]
		if nb > producerBatchesKept || len(body) < nb*snapshotBatchSize {
			return 0, nil, x, errBadSnapshot
		}
		for j := 0; j < nb; j++ {
			e.batches = append(e.batches, ProducerBatch{
				FirstSeq:     int32(binary.BigEndian.Uint32(body)),
				LastSeq:      int32(binary.BigEndian.Uint32(body[4:])),
				FirstOffset:  int64(binary.BigEndian.Uint64(body[8:])),
				LastOffset:   int64(binary.BigEndian.Uint64(body[16:])),
				MaxTimestamp: int64(binary.BigEndian.Uint64(body[24:])),
			})
			body = body[snapshotBatchSize:]
		}
		t[id] = e
		ids = append(ids, id)
	}
	if version >= 2 {
		var err error
		if x, body, err = decodeTxnSnapshot(body, ids); err != nil {
			return 0, nil, x, err
		}
	}
	if len(body) != 0 {
		return 0, nil, x, errBadSnapshot
	}
	return offset, t, x, nil
}

// loadNewestSnapshot returns the newest readable snapshot at or below
// maxOffset; with none it returns offset -1 and an empty table.
func loadNewestSnapshot(fsys FS, dir string, snaps []int64, maxOffset int64) (int64, producerTable, txnIndex) {
	for i := len(snaps) - 1; i >= 0; i-- {
		if snaps[i] > maxOffset {
			_ = fsys.Remove(segmentName(dir, snaps[i], snapshotSuffix))
			continue
		}
		b, err := readFile(fsys, segmentName(dir, snaps[i], snapshotSuffix))
		if err != nil {
			continue
		}
		off, t, x, err := decodeSnapshot(b)
		if err != nil || off != snaps[i] {
			continue
		}
		return off, t, x
	}
	return -1, producerTable{}, newTxnIndex()
}

// writeSnapshot persists t as of offset and prunes all but the two newest
// snapshots.
func writeSnapshot(fsys FS, dir string, offset int64, t producerTable, x txnIndex) error {
	if err := writeFileAtomic(fsys, segmentName(dir, offset, snapshotSuffix), encodeSnapshot(offset, t, x)); err != nil {
		return storageErr("write producer snapshot", err)
	}
	_, snaps, err := listSegmentBases(fsys, dir, false)
	if err != nil {
		return nil
	}
	for i := 0; i+2 < len(snaps); i++ {
		_ = fsys.Remove(segmentName(dir, snaps[i], snapshotSuffix))
	}
	return nil
}
