package broker

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"iter"
	"slices"
	"time"

	"github.com/outboxrelay/relay/internal/recordsize"
)

// Record batch v2 field positions. baseOffset and partitionLeaderEpoch sit
// before the CRC so the broker can rewrite them without re-checksumming.
const (
	batchOffsetPos      = 0
	batchLengthPos      = 8
	batchLeaderEpochPos = 12
	batchMagicPos       = 16
	batchCRCPos         = 17
	batchAttrPos        = 21
	batchLastDeltaPos   = 23
	batchBaseTSPos      = 27
	batchMaxTSPos       = 35
	batchProducerIDPos  = 43
	batchEpochPos       = 51
	batchBaseSeqPos     = 53
	batchCountPos       = 57
	// BatchHeaderSize is the size of the fixed record batch v2 header.
	BatchHeaderSize = 61
	// batchLogOverhead is the part of the header not counted by batchLength.
	batchLogOverhead = 12
)

const (
	attrCompressionMask = 0x07
	attrLogAppendTime   = 0x08
	attrTransactional   = 0x10
	attrControl         = 0x20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a record header. A nil Value is a null header value.
type Header struct {
	Key   string
	Value []byte
}

// Record is one Kafka record. A nil Key or Value is null; a nil Value is a
// tombstone on compacted topics. Offset is absolute when the record came from
// the log and ignored when encoding.
type Record struct {
	Offset    int64
	Timestamp time.Time
	Key       []byte
	Value     []byte
	Headers   []Header
}

// BatchHeader is the decoded fixed header of a record batch v2.
type BatchHeader struct {
	BaseOffset           int64
	Length               int32
	PartitionLeaderEpoch int32
	Magic                int8
	CRC                  uint32
	Attributes           int16
	LastOffsetDelta      int32
	BaseTimestamp        int64
	MaxTimestamp         int64
	ProducerID           int64
	ProducerEpoch        int16
	BaseSequence         int32
	NumRecords           int32
}

// Size is the number of bytes the batch occupies in a log or fetch response.
func (h BatchHeader) Size() int { return int(h.Length) + batchLogOverhead }

// LastOffset is the offset of the batch's last record (compaction may have
// removed that record, but the offset stays reserved).
func (h BatchHeader) LastOffset() int64 { return h.BaseOffset + int64(h.LastOffsetDelta) }

// Compression is the codec named by the attributes.
func (h BatchHeader) Compression() Compression {
	return Compression(h.Attributes & attrCompressionMask)
}

// Transactional reports the transactional attribute bit.
func (h BatchHeader) Transactional() bool { return h.Attributes&attrTransactional != 0 }

// Control reports the control-batch attribute bit.
func (h BatchHeader) Control() bool { return h.Attributes&attrControl != 0 }

// Idempotent reports whether the batch carries producer id and sequence.
func (h BatchHeader) Idempotent() bool { return h.ProducerID >= 0 }

// LastSequence is the sequence of the batch's last record; sequences wrap
// from MaxInt32 to 0 as Kafka defines.
func (h BatchHeader) LastSequence() int32 {
	return addSeq(h.BaseSequence, h.LastOffsetDelta)
}

func addSeq(seq, delta int32) int32 {
	s := int64(seq) + int64(delta)
	if s > 1<<31-1 {
		s -= 1 << 31
	}
	return int32(s)
}

// ParseBatchHeader decodes the fixed header at the start of b without
// checking the CRC. It needs only BatchHeaderSize bytes.
func ParseBatchHeader(b []byte) (BatchHeader, error) {
	if len(b) < BatchHeaderSize {
		return BatchHeader{}, fmt.Errorf("%w: %d bytes is shorter than a batch header", ErrCorruptBatch, len(b))
	}
	h := BatchHeader{
		BaseOffset:           int64(binary.BigEndian.Uint64(b[batchOffsetPos:])),
		Length:               int32(binary.BigEndian.Uint32(b[batchLengthPos:])),
		PartitionLeaderEpoch: int32(binary.BigEndian.Uint32(b[batchLeaderEpochPos:])),
		Magic:                int8(b[batchMagicPos]),
		CRC:                  binary.BigEndian.Uint32(b[batchCRCPos:]),
		Attributes:           int16(binary.BigEndian.Uint16(b[batchAttrPos:])),
		LastOffsetDelta:      int32(binary.BigEndian.Uint32(b[batchLastDeltaPos:])),
		BaseTimestamp:        int64(binary.BigEndian.Uint64(b[batchBaseTSPos:])),
		MaxTimestamp:         int64(binary.BigEndian.Uint64(b[batchMaxTSPos:])),
		ProducerID:           int64(binary.BigEndian.Uint64(b[batchProducerIDPos:])),
		ProducerEpoch:        int16(binary.BigEndian.Uint16(b[batchEpochPos:])),
		BaseSequence:         int32(binary.BigEndian.Uint32(b[batchBaseSeqPos:])),
		NumRecords:           int32(binary.BigEndian.Uint32(b[batchCountPos:])),
	}
	if h.Magic != 2 {
		return h, fmt.Errorf("%w: magic %d", ErrUnsupportedMagic, h.Magic)
	}
	if h.Length < BatchHeaderSize-batchLogOverhead {
		return h, fmt.Errorf("%w: batch length %d below header size", ErrCorruptBatch, h.Length)
	}
	if h.LastOffsetDelta < 0 || h.NumRecords < 0 {
		return h, fmt.Errorf("%w: negative record count or offset delta", ErrCorruptBatch)
	}
	return h, nil
}

// VerifyBatch checks that b is exactly one complete record batch v2 with a
// valid CRC32C and returns its header.
func VerifyBatch(b []byte) (BatchHeader, error) {
	h, err := ParseBatchHeader(b)
	if err != nil {
		return h, err
	}
	if h.Size() != len(b) {
		return h, fmt.Errorf("%w: batch length field says %d bytes, got %d", ErrCorruptBatch, h.Size(), len(b))
	}
	if crc := crc32.Checksum(b[batchAttrPos:], castagnoli); crc != h.CRC {
		return h, fmt.Errorf("%w: stored %08x, computed %08x", ErrInvalidCRC, h.CRC, crc)
	}
	return h, nil
}

// setBaseOffset rewrites the batch's base offset in place; the field is
// outside the CRC so the checksum stays valid.
func setBaseOffset(b []byte, off int64) {
	binary.BigEndian.PutUint64(b[batchOffsetPos:], uint64(off))
}

// BatchOptions describe the producer fields of a batch built by AppendBatch.
// ProducerID -1 builds a non-idempotent batch.
type BatchOptions struct {
	ProducerID    int64
	ProducerEpoch int16
	BaseSequence  int32
	Compression   Compression
	// BaseOffset is normally 0: the broker assigns offsets on append.
	BaseOffset int64
	// logAppendTime keeps the timestamp-type bit when compaction re-encodes
	// a batch.
	logAppendTime bool
	// transactional keeps the transactional bit likewise.
	transactional bool
}

// EncodeBatch builds an uncompressed record batch v2 for an idempotent
// producer (or a plain one with producerID -1). Records with a zero
// Timestamp get the current time. Record offsets are ignored; records get
// consecutive offset deltas.
func EncodeBatch(producerID int64, epoch int16, baseSeq int32, records []Record) []byte {
	b, err := AppendBatch(nil, BatchOptions{ProducerID: producerID, ProducerEpoch: epoch, BaseSequence: baseSeq}, records)
	if err != nil {
		// Only compression can fail and none is requested; an empty slice
		// keeps the no-panic promise should that ever change.
		return nil
	}
	return b
}

// AppendBatch appends a record batch v2 holding records to dst.
func AppendBatch(dst []byte, opts BatchOptions, records []Record) ([]byte, error) {
	deltas := make([]int32, len(records))
	for i := range records {
		deltas[i] = int32(i)
	}
	last := int32(len(records) - 1)
	if last < 0 {
		last = 0
	}
	return appendBatchWithDeltas(dst, opts, records, deltas, last, 0, 0, false)
}

// appendBatchWithDeltas is the general encoder: compaction uses it to keep
// original offset deltas, timestamps and the last offset delta of a batch
// whose records were filtered.
func appendBatchWithDeltas(dst []byte, opts BatchOptions, records []Record, deltas []int32, lastDelta int32, baseTS, maxTS int64, keepTS bool) ([]byte, error) {
	now := time.Now().UnixMilli()
	if !keepTS {
		baseTS, maxTS = -1, -1
		for i := range records {
			ts := tsMillis(records[i].Timestamp, now)
			if baseTS == -1 || ts < baseTS {
				baseTS = ts
			}
			if ts > maxTS {
				maxTS = ts
			}
		}
		if baseTS == -1 {
			baseTS, maxTS = now, now
		}
	}
	attrs := int16(opts.Compression) & attrCompressionMask
	if opts.logAppendTime {
		attrs |= attrLogAppendTime
	}
	if opts.transactional {
		attrs |= attrTransactional
	}
	start := len(dst)
	var body []byte
	if opts.Compression == CompressionNone {
		// Records go straight after the header, in one allocation.
		size := BatchHeaderSize
		for i := range records {
			size += maxRecordLen(&records[i])
		}
		dst = slices.Grow(dst, size)
		dst = dst[:start+BatchHeaderSize]
		for i := range records {
			dst = appendRecord(dst, &records[i], recordTSDelta(&records[i], opts, now, baseTS), deltas[i])
		}
		body = dst[start+BatchHeaderSize:]
	} else {
		raw := make([]byte, 0, 64*len(records))
		for i := range records {
			raw = appendRecord(raw, &records[i], recordTSDelta(&records[i], opts, now, baseTS), deltas[i])
		}
		c, err := compress(opts.Compression, raw)
		if err != nil {
			return dst, err
		}
		body = c
		dst = slices.Grow(dst, BatchHeaderSize+len(body))
		dst = append(dst[:start+BatchHeaderSize], body...)
	}
	hdr := dst[start : start+BatchHeaderSize]
	binary.BigEndian.PutUint64(hdr[batchOffsetPos:], uint64(opts.BaseOffset))
	binary.BigEndian.PutUint32(hdr[batchLengthPos:], uint32(BatchHeaderSize-batchLogOverhead+len(body)))
	binary.BigEndian.PutUint32(hdr[batchLeaderEpochPos:], 0xffffffff)
	hdr[batchMagicPos] = 2
	binary.BigEndian.PutUint32(hdr[batchCRCPos:], 0)
	binary.BigEndian.PutUint16(hdr[batchAttrPos:], uint16(attrs))
	binary.BigEndian.PutUint32(hdr[batchLastDeltaPos:], uint32(lastDelta))
	binary.BigEndian.PutUint64(hdr[batchBaseTSPos:], uint64(baseTS))
	binary.BigEndian.PutUint64(hdr[batchMaxTSPos:], uint64(maxTS))
	binary.BigEndian.PutUint64(hdr[batchProducerIDPos:], uint64(opts.ProducerID))
	binary.BigEndian.PutUint16(hdr[batchEpochPos:], uint16(opts.ProducerEpoch))
	binary.BigEndian.PutUint32(hdr[batchBaseSeqPos:], uint32(opts.BaseSequence))
	binary.BigEndian.PutUint32(hdr[batchCountPos:], uint32(len(records)))
	crc := crc32.Checksum(dst[start+batchAttrPos:], castagnoli)
	binary.BigEndian.PutUint32(dst[start+batchCRCPos:], crc)
	return dst, nil
}

func recordTSDelta(r *Record, opts BatchOptions, now, baseTS int64) int64 {
	if opts.logAppendTime {
		return 0
	}
	return tsMillis(r.Timestamp, now) - baseTS
}

// maxRecordLen bounds the encoded size of r, its length prefix included,
// whatever its timestamp and offset deltas.
func maxRecordLen(r *Record) int {
	size := 1 + binary.MaxVarintLen64 + binary.MaxVarintLen32
	size += recordsize.Bytes(r.Key) + recordsize.Bytes(r.Value)
	size += recordsize.Varint(int64(len(r.Headers)))
	for _, h := range r.Headers {
		size += recordsize.Varint(int64(len(h.Key))) + len(h.Key) + recordsize.Bytes(h.Value)
	}
	return binary.MaxVarintLen32 + size
}

func tsMillis(t time.Time, now int64) int64 {
	if t.IsZero() {
		return now
	}
	return t.UnixMilli()
}

func appendRecord(dst []byte, r *Record, tsDelta int64, offDelta int32) []byte {
	size := 1 + recordsize.Varint(tsDelta) + recordsize.Varint(int64(offDelta))
	size += recordsize.Bytes(r.Key) + recordsize.Bytes(r.Value)
	size += recordsize.Varint(int64(len(r.Headers)))
	for _, h := range r.Headers {
		size += recordsize.Varint(int64(len(h.Key))) + len(h.Key) + recordsize.Bytes(h.Value)
	}
	dst = binary.AppendVarint(dst, int64(size))
	dst = append(dst, 0)
	dst = binary.AppendVarint(dst, tsDelta)
	dst = binary.AppendVarint(dst, int64(offDelta))
	dst = appendNullableBytes(dst, r.Key)
	dst = appendNullableBytes(dst, r.Value)
	dst = binary.AppendVarint(dst, int64(len(r.Headers)))
	for _, h := range r.Headers {
		dst = binary.AppendVarint(dst, int64(len(h.Key)))
		dst = append(dst, h.Key...)
		dst = appendNullableBytes(dst, h.Value)
	}
	return dst
}

func appendNullableBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	dst = binary.AppendVarint(dst, int64(len(b)))
	return append(dst, b...)
}

// DecodeBatch verifies one complete batch and decodes its records (after
// decompression) with absolute offsets. Decoded slices alias a decompression
// buffer or b itself; copy them to keep them past b's lifetime.
func DecodeBatch(b []byte) (BatchHeader, []Record, error) {
	h, err := VerifyBatch(b)
	if err != nil {
		return h, nil, err
	}
	recs, err := decodeRecords(h, b, maxDecompressedSize)
	return h, recs, err
}

// maxDecompressedSize bounds decompression so a small hostile batch cannot
// make the broker allocate without limit.
const maxDecompressedSize = 64 << 20

func decodeRecords(h BatchHeader, b []byte, limit int) ([]Record, error) {
	body := b[BatchHeaderSize:]
	if c := h.Compression(); c != CompressionNone {
		var err error
		body, err = decompress(c, body, limit)
		if err != nil {
			return nil, err
		}
	}
	if h.NumRecords > int32(len(body)/7+1) {
		return nil, fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrCorruptBatch, h.NumRecords, len(body))
	}
	recs := make([]Record, 0, h.NumRecords)
	for i := int32(0); i < h.NumRecords; i++ {
		r, n, err := decodeRecord(body, h)
		if err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
		recs = append(recs, r)
		body = body[n:]
	}
	if len(body) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after records", ErrCorruptBatch, len(body))
	}
	return recs, nil
}

// recordReader walks varint-encoded fields; the first failure sticks so the
// decoder checks once per record instead of after every field.
type recordReader struct {
	b   []byte
	err error
}

var errShortRecord = fmt.Errorf("%w: truncated record", ErrCorruptBatch)

func (r *recordReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := varint(r.b)
	if n <= 0 {
		r.err = errShortRecord
		return 0
	}
	r.b = r.b[n:]
	return v
}

// varint is binary.Varint with the one- and two-byte values, which are
// most fields of a record (timestamp and offset deltas, lengths, header
// counts), decoded inline: walking a produced batch's records costs about
// half as much.
func varint(b []byte) (int64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return int64(b[0]>>1) ^ -int64(b[0]&1), 1
	}
	if len(b) > 1 && b[1] < 0x80 {
		u := uint64(b[0]&0x7f) | uint64(b[1])<<7
		return int64(u>>1) ^ -int64(u&1), 2
	}
	return binary.Varint(b)
}

func (r *recordReader) bytes() []byte {
	n := r.varint()
	if r.err != nil || n < 0 {
		return nil
	}
	if n > int64(len(r.b)) {
		r.err = errShortRecord
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// skipBytes steps over a nullable byte string and reports whether it was
// null.
func (r *recordReader) skipBytes() bool {
	n := r.varint()
	if r.err != nil || n < 0 {
		return r.err == nil
	}
	if n > int64(len(r.b)) {
		r.err = errShortRecord
		return false
	}
	r.b = r.b[n:]
	return false
}

func decodeRecord(b []byte, h BatchHeader) (Record, int, error) {
	length, n := binary.Varint(b)
	if n <= 0 || length < 0 || length > int64(len(b)-n) {
		return Record{}, 0, errShortRecord
	}
	rr := recordReader{b: b[n : n+int(length)]}
	if len(rr.b) < 1 {
		return Record{}, 0, errShortRecord
	}
	rr.b = rr.b[1:] // record attributes are unused in v2
	tsDelta := rr.varint()
	offDelta := rr.varint()
	key := rr.bytes()
	value := rr.bytes()
	nh := rr.varint()
	if rr.err != nil {
		return Record{}, 0, rr.err
	}
	if nh < 0 || nh > int64(len(rr.b)) {
		return Record{}, 0, fmt.Errorf("%w: header count %d", ErrCorruptBatch, nh)
	}
	var headers []Header
	if nh > 0 {
		headers = make([]Header, 0, nh)
	}
	for i := int64(0); i < nh; i++ {
		k := rr.bytes()
		v := rr.bytes()
		if rr.err != nil {
			return Record{}, 0, rr.err
		}
		headers = append(headers, Header{Key: string(k), Value: v})
	}
	if len(rr.b) != 0 {
		return Record{}, 0, fmt.Errorf("%w: record length disagrees with its fields", ErrCorruptBatch)
	}
	if offDelta < 0 || offDelta > int64(h.LastOffsetDelta) {
		return Record{}, 0, fmt.Errorf("%w: offset delta %d outside batch", ErrCorruptBatch, offDelta)
	}
	ts := h.BaseTimestamp + tsDelta
	if h.Attributes&attrLogAppendTime != 0 {
		ts = h.MaxTimestamp
	}
	return Record{
		Offset:    h.BaseOffset + offDelta,
		Timestamp: time.UnixMilli(ts),
		Key:       key,
		Value:     value,
		Headers:   headers,
	}, n + int(length), nil
}

// checkUncompressedRecords walks the records of an uncompressed batch to
// make sure they parse, without allocating, so the log never stores a batch
// whose CRC is right but whose records are garbage.
func checkUncompressedRecords(h BatchHeader, b []byte) error {
	body := b[BatchHeaderSize:]
	for i := int32(0); i < h.NumRecords; i++ {
		length, n := binary.Varint(body)
		if n <= 0 || length <= 0 || length > int64(len(body)-n) {
			return fmt.Errorf("record %d: %w", i, errShortRecord)
		}
		body = body[n+int(length):]
	}
	if len(body) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after records", ErrCorruptBatch, len(body))
	}
	return nil
}

// KeylessRecordError is ErrKeylessCompacted for a batch: Index is the
// first record without a key, by its position in the batch (what Produce
// v8+ reports in its record errors).
type KeylessRecordError struct{ Index int32 }

func (e *KeylessRecordError) Error() string {
	return fmt.Sprintf("%v: record %d of the batch has no key", ErrKeylessCompacted, e.Index)
}

func (e *KeylessRecordError) Unwrap() error { return ErrKeylessCompacted }

// walkRecords applies decodeRecords' checks to the (decompressed) records
// body without building Records, so validating a produced batch allocates
// nothing. With needKeys, a record with a null key fails with
// ErrKeylessCompacted, reported only once every record has parsed (as
// decoding first and then checking keys would).
func walkRecords(h BatchHeader, body []byte, needKeys bool) error {
	if h.NumRecords > int32(len(body)/7+1) {
		return fmt.Errorf("%w: %d records cannot fit in %d bytes", ErrCorruptBatch, h.NumRecords, len(body))
	}
	keyless := int32(-1)
	for i := int32(0); i < h.NumRecords; i++ {
		n, _, nullKey, err := walkRecord(body, h)
		if err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		if needKeys && nullKey && keyless < 0 {
			keyless = i
		}
		body = body[n:]
	}
	if len(body) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after records", ErrCorruptBatch, len(body))
	}
	if keyless >= 0 {
		return &KeylessRecordError{Index: keyless}
	}
	return nil
}

// walkRecord checks one record as decodeRecord does and returns its size,
// offset delta and whether its key is null.
func walkRecord(b []byte, h BatchHeader) (int, int64, bool, error) {
	length, n := varint(b)
	if n <= 0 || length < 0 || length > int64(len(b)-n) {
		return 0, 0, false, errShortRecord
	}
	rr := recordReader{b: b[n : n+int(length)]}
	if len(rr.b) < 1 {
		return 0, 0, false, errShortRecord
	}
	rr.b = rr.b[1:]
	rr.varint() // timestamp delta
	offDelta := rr.varint()
	nullKey := rr.skipBytes()
	rr.skipBytes() // value
	nh := rr.varint()
	if rr.err != nil {
		return 0, 0, false, rr.err
	}
	if nh < 0 || nh > int64(len(rr.b)) {
		return 0, 0, false, fmt.Errorf("%w: header count %d", ErrCorruptBatch, nh)
	}
	for i := int64(0); i < nh; i++ {
		rr.skipBytes()
		rr.skipBytes()
		if rr.err != nil {
			return 0, 0, false, rr.err
		}
	}
	if len(rr.b) != 0 {
		return 0, 0, false, fmt.Errorf("%w: record length disagrees with its fields", ErrCorruptBatch)
	}
	if offDelta < 0 || offDelta > int64(h.LastOffsetDelta) {
		return 0, 0, false, fmt.Errorf("%w: offset delta %d outside batch", ErrCorruptBatch, offDelta)
	}
	return n + int(length), offDelta, nullKey, nil
}

// Batches iterates over a byte slice holding whole batches back to back (a
// fetch response or a segment), yielding each verified batch. Iteration stops
// at the first error, which is yielded once.
func Batches(data []byte) iter.Seq2[[]byte, error] {
	return func(yield func([]byte, error) bool) {
		for len(data) > 0 {
			h, err := ParseBatchHeader(data)
			if err != nil {
				yield(nil, err)
				return
			}
			if h.Size() > len(data) {
				yield(nil, fmt.Errorf("%w: batch of %d bytes truncated to %d", ErrCorruptBatch, h.Size(), len(data)))
				return
			}
			b := data[:h.Size()]
			if _, err := VerifyBatch(b); err != nil {
				yield(nil, err)
				return
			}
			if !yield(b, nil) {
				return
			}
			data = data[h.Size():]
		}
	}
}

// ReadRecords iterates over the records of back-to-back batches with their
// absolute offsets; the first decoding error ends the iteration.
func ReadRecords(data []byte) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		for b, err := range Batches(data) {
			if err != nil {
				yield(Record{}, err)
				return
			}
			_, recs, err := DecodeBatch(b)
			if err != nil {
				yield(Record{}, err)
				return
			}
			for _, r := range recs {
				if !yield(r, nil) {
					return
				}
			}
		}
	}
}
