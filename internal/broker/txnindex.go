package broker

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sort"
)

// AbortedTxn is one aborted transaction of a partition, as Fetch reports it
// to read_committed consumers: the producer's records from FirstOffset up
// to the abort marker at LastOffset are to be skipped.
type AbortedTxn struct {
	ProducerID  int64
	FirstOffset int64
	LastOffset  int64
}

// txnIndex is what a partition knows about transactions: the first offset
// of each producer's open transaction and the aborted ones, in the order
// of their markers. It is part of the producer state (snapshots, replay).
type txnIndex struct {
	open    map[int64]int64
	aborted []AbortedTxn
}

func newTxnIndex() txnIndex { return txnIndex{open: map[int64]int64{}} }

// Control record types (the key of a control record: int16 version 0,
// int16 type).
const (
	controlAbort  = 0
	controlCommit = 1
)

// note records an appended (or replayed) batch; marker is the control type
// of a control batch (ignored otherwise).
func (x *txnIndex) note(h BatchHeader, marker int16) {
	if !h.Transactional() || h.ProducerID < 0 {
		return
	}
	first, open := x.open[h.ProducerID]
	if !h.Control() {
		if !open {
			x.open[h.ProducerID] = h.BaseOffset
		}
		return
	}
	if !open {
		// A marker for a transaction this partition holds no data of
		// (it was added but never written to, or a marker written again
		// by recovery): nothing to close.
		return
	}
	delete(x.open, h.ProducerID)
	if marker == controlAbort {
		x.aborted = append(x.aborted, AbortedTxn{ProducerID: h.ProducerID, FirstOffset: first, LastOffset: h.BaseOffset})
	}
}

// stable is the last stable offset given the high watermark.
func (x *txnIndex) stable(hw int64) int64 {
	lso := hw
	for _, first := range x.open {
		lso = min(lso, first)
	}
	return lso
}

// abortedIn returns the aborted transactions that overlap [from, to].
func (x *txnIndex) abortedIn(from, to int64) []AbortedTxn {
	i := sort.Search(len(x.aborted), func(i int) bool { return x.aborted[i].LastOffset >= from })
	var out []AbortedTxn
	for _, a := range x.aborted[i:] {
		if a.FirstOffset <= to {
			out = append(out, a)
		}
	}
	return out
}

// isAborted reports whether a batch of the producer at offset belongs to an
// aborted transaction.
func (x *txnIndex) isAborted(producerID, offset int64) bool {
	i := sort.Search(len(x.aborted), func(i int) bool { return x.aborted[i].LastOffset >= offset })
	for _, a := range x.aborted[i:] {
		if a.ProducerID == producerID && a.FirstOffset <= offset {
			return true
		}
	}
	return false
}

// prune forgets aborted transactions wholly below the log start.
func (x *txnIndex) prune(logStart int64) {
	n := 0
	for n < len(x.aborted) && x.aborted[n].LastOffset < logStart {
		n++
	}
	if n > 0 {
		x.aborted = append([]AbortedTxn(nil), x.aborted[n:]...)
	}
}

func (x *txnIndex) clone() txnIndex {
	c := txnIndex{open: make(map[int64]int64, len(x.open)), aborted: append([]AbortedTxn(nil), x.aborted...)}
	for id, first := range x.open {
		c.open[id] = first
	}
	return c
}

// controlType returns the marker type of a control batch from its first
// record (control batches are never compressed), or -1 when the bytes do
// not hold one. b starts at the batch and holds at least its first record.
func controlType(b []byte) int16 {
	if len(b) <= BatchHeaderSize {
		return -1
	}
	r := recordReader{b: b[BatchHeaderSize:]}
	r.varint() // record length
	if len(r.b) < 1 {
		return -1
	}
	r.b = r.b[1:] // attributes
	r.varint()    // timestamp delta
	r.varint()    // offset delta
	key := r.bytes()
	if r.err != nil || len(key) < 4 {
		return -1
	}
	return int16(binary.BigEndian.Uint16(key[2:]))
}

// controlPeek is how many bytes of a control batch controlType needs.
const controlPeek = BatchHeaderSize + 32

// markerBatch builds the control batch ending a transaction: one control
// record (key: version 0, type; value: version 0, coordinator epoch 0)
// under the producer's id and epoch, sequence -1, as Kafka writes it.
func markerBatch(producerID int64, epoch int16, commit bool, nowMs int64) []byte {
	typ := int16(controlAbort)
	if commit {
		typ = controlCommit
	}
	key := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, 0), uint16(typ))
	value := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint16(nil, 0), 0)
	var rec []byte
	rec = append(rec, 0)              // attributes
	rec = binary.AppendVarint(rec, 0) // timestamp delta
	rec = binary.AppendVarint(rec, 0) // offset delta
	rec = binary.AppendVarint(rec, int64(len(key)))
	rec = append(rec, key...)
	rec = binary.AppendVarint(rec, int64(len(value)))
	rec = append(rec, value...)
	rec = binary.AppendVarint(rec, 0) // headers
	b := make([]byte, BatchHeaderSize, BatchHeaderSize+len(rec)+2)
	b = binary.AppendVarint(b, int64(len(rec)))
	b = append(b, rec...)
	binary.BigEndian.PutUint32(b[batchLengthPos:], uint32(len(b)-batchLogOverhead))
	binary.BigEndian.PutUint32(b[batchLeaderEpochPos:], 0xffffffff)
	b[batchMagicPos] = 2
	binary.BigEndian.PutUint16(b[batchAttrPos:], attrTransactional|attrControl)
	binary.BigEndian.PutUint32(b[batchLastDeltaPos:], 0)
	binary.BigEndian.PutUint64(b[batchBaseTSPos:], uint64(nowMs))
	binary.BigEndian.PutUint64(b[batchMaxTSPos:], uint64(nowMs))
	binary.BigEndian.PutUint64(b[batchProducerIDPos:], uint64(producerID))
	binary.BigEndian.PutUint16(b[batchEpochPos:], uint16(epoch))
	binary.BigEndian.PutUint32(b[batchBaseSeqPos:], 0xffffffff)
	binary.BigEndian.PutUint32(b[batchCountPos:], 1)
	binary.BigEndian.PutUint32(b[batchCRCPos:], crc32.Checksum(b[batchAttrPos:], castagnoli))
	return b
}

// appendTxnSnapshot appends the version 2 part of a snapshot: the open
// transaction of each producer in ids (-1 for none), then the aborted list.
func appendTxnSnapshot(b []byte, ids []int64, x txnIndex) []byte {
	for _, id := range ids {
		first, ok := x.open[id]
		if !ok {
			first = -1
		}
		b = binary.BigEndian.AppendUint64(b, uint64(first))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(x.aborted)))
	for _, a := range x.aborted {
		b = binary.BigEndian.AppendUint64(b, uint64(a.ProducerID))
		b = binary.BigEndian.AppendUint64(b, uint64(a.FirstOffset))
		b = binary.BigEndian.AppendUint64(b, uint64(a.LastOffset))
	}
	return b
}

// decodeTxnSnapshot reads what appendTxnSnapshot wrote and returns the rest.
func decodeTxnSnapshot(body []byte, ids []int64) (txnIndex, []byte, error) {
	x := newTxnIndex()
	if len(body) < 8*len(ids)+4 {
		return x, nil, errBadSnapshot
	}
	for _, id := range ids {
		if first := int64(binary.BigEndian.Uint64(body)); first >= 0 {
			x.open[id] = first
		}
		body = body[8:]
	}
	n := binary.BigEndian.Uint32(body)
	body = body[4:]
	if uint64(len(body)) < uint64(n)*24 {
		return x, nil, fmt.Errorf("%w: aborted list", errBadSnapshot)
	}
	for i := uint32(0); i < n; i++ {
		x.aborted = append(x.aborted, AbortedTxn{
			ProducerID:  int64(binary.BigEndian.Uint64(body)),
			FirstOffset: int64(binary.BigEndian.Uint64(body[8:])),
			LastOffset:  int64(binary.BigEndian.Uint64(body[16:])),
		})
		body = body[24:]
	}
	return x, body, nil
}
