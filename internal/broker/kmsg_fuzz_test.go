package broker

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// kmsgRecords decodes an uncompressed record batch with franz-go's kmsg, a
// codec this package did not write: the batch header by
// kmsg.RecordBatch, each record by kmsg.Record.
func kmsgRecords(t *testing.T, b []byte) (kmsg.RecordBatch, []kmsg.Record, bool) {
	var rb kmsg.RecordBatch
	if err := rb.ReadFrom(b); err != nil {
		return rb, nil, false
	}
	var out []kmsg.Record
	rest := rb.Records
	for i := int32(0); i < rb.NumRecords; i++ {
		length, n := binary.Varint(rest)
		if n <= 0 || length < 0 || int64(len(rest)-n) < length {
			return rb, nil, false
		}
		var r kmsg.Record
		if err := r.ReadFrom(rest[:n+int(length)]); err != nil {
			return rb, nil, false
		}
		out = append(out, r)
		rest = rest[n+int(length):]
	}
	return rb, out, len(rest) == 0
}

func sameRecords(t *testing.T, h BatchHeader, ours []Record, rb kmsg.RecordBatch, theirs []kmsg.Record) {
	t.Helper()
	if rb.FirstOffset != h.BaseOffset || rb.ProducerID != h.ProducerID || rb.ProducerEpoch != h.ProducerEpoch ||
		rb.FirstSequence != h.BaseSequence || rb.NumRecords != h.NumRecords || rb.LastOffsetDelta != h.LastOffsetDelta ||
		rb.FirstTimestamp != h.BaseTimestamp || rb.MaxTimestamp != h.MaxTimestamp || uint32(rb.CRC) != h.CRC || rb.Attributes != h.Attributes {
		t.Fatalf("batch headers differ: ours %+v, kmsg %+v", h, rb)
	}
	if len(ours) != len(theirs) {
		t.Fatalf("%d records, kmsg decoded %d", len(ours), len(theirs))
	}
	for i, r := range theirs {
		o := ours[i]
		if o.Offset != h.BaseOffset+int64(r.OffsetDelta) || o.Timestamp.UnixMilli() != h.BaseTimestamp+r.TimestampDelta64 ||
			!bytes.Equal(o.Key, r.Key) || (o.Key == nil) != (r.Key == nil) || !bytes.Equal(o.Value, r.Value) || (o.Value == nil) != (r.Value == nil) ||
			len(o.Headers) != len(r.Headers) {
			t.Fatalf("record %d differs: ours %+v, kmsg %+v", i, o, r)
		}
		for j, kh := range r.Headers {
			if o.Headers[j].Key != kh.Key || !bytes.Equal(o.Headers[j].Value, kh.Value) || (o.Headers[j].Value == nil) != (kh.Value == nil) {
				t.Fatalf("record %d header %d differs: ours %+v, kmsg %+v", i, j, o.Headers[j], kh)
			}
		}
	}
}

// FuzzCodecAgainstKmsg checks the batch codec differentially against
// franz-go's kmsg, both ways: records this package encodes are what kmsg
// decodes, CRC included; and any bytes this package's decoder accepts as an
// uncompressed batch, kmsg decodes to the same records.
func FuzzCodecAgainstKmsg(f *testing.F) {
	f.Add([]byte("key"), []byte("value"), "h", []byte("v"), int64(1_700_000_000_000), int64(7), int16(1), int32(5), uint8(3), false)
	f.Add([]byte(nil), []byte(nil), "", []byte(nil), int64(0), int64(-1), int16(-1), int32(-1), uint8(1), true)
	f.Add(bytes.Repeat([]byte("k"), 300), bytes.Repeat([]byte("x"), 4000), "relay-event-id", []byte("e1"), int64(1), int64(1<<40), int16(32767), int32(1<<31-1), uint8(9), false)
	f.Fuzz(func(t *testing.T, key, value []byte, hk string, hv []byte, ts, pid int64, epoch int16, seq int32, n uint8, corrupt bool) {
		n = n%8 + 1
		key, value, hv = clipFuzz(key), clipFuzz(value), clipFuzz(hv)
		recs := make([]Record, n)
		for i := range recs {
			recs[i] = Record{Timestamp: time.UnixMilli(ts%(1<<50) + int64(i)), Key: key, Value: value}
			if hk != "" || hv != nil {
				recs[i].Headers = []Header{{Key: hk, Value: hv}}
			}
		}
		b, err := AppendBatch(nil, BatchOptions{ProducerID: pid, ProducerEpoch: epoch, BaseSequence: seq}, recs)
		if err != nil {
			t.Skip("options this encoder refuses")
		}
		if corrupt && len(b) > 61 {
			// Same bytes in, same records out, for bytes that are not this
			// encoder's: flip one byte past the header, fix the CRC.
			b[61+int(uint(ts)%uint(len(b)-61))] ^= 0x5a
			binary.BigEndian.PutUint32(b[17:], crc32.Checksum(b[21:], castagnoli))
		}
		h, ours, err := DecodeBatch(b)
		if err != nil {
			if !corrupt {
				t.Fatalf("decoding our own batch: %v", err)
			}
			// Refusing damaged bytes is right; what this decoder accepts
			// is what kmsg must agree with.
			return
		}
		rb, theirs, ok := kmsgRecords(t, b)
		if !ok {
			t.Fatalf("this package decoded %d records that kmsg cannot", len(ours))
		}
		if !corrupt && uint32(rb.CRC) != crc32.Checksum(b[21:], castagnoli) {
			t.Fatal("the CRC kmsg reads does not cover attributes to the end")
		}
		sameRecords(t, h, ours, rb, theirs)
	})
}

// clipFuzz bounds a fuzzed field, so each run stays cheap: the codec's
// length handling is the same at 4 KiB as beyond.
func clipFuzz(b []byte) []byte {
	if len(b) > 4096 {
		return b[:4096]
	}
	return b
}
