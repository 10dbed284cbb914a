package broker

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

func FuzzDecodeBatch(f *testing.F) {
	f.Add(EncodeBatch(1, 0, 0, recs("f", 3)))
	for _, c := range []Compression{CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		b, _ := AppendBatch(nil, BatchOptions{ProducerID: -1, Compression: c}, recs("f", 2))
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, rs, err := DecodeBatch(data)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to a batch that decodes alike.
		opts := BatchOptions{ProducerID: h.ProducerID, ProducerEpoch: h.ProducerEpoch, BaseSequence: h.BaseSequence, BaseOffset: h.BaseOffset}
		deltas := make([]int32, len(rs))
		for i, r := range rs {
			deltas[i] = int32(r.Offset - h.BaseOffset)
		}
		again, err := appendBatchWithDeltas(nil, opts, rs, deltas, h.LastOffsetDelta, h.BaseTimestamp, h.MaxTimestamp, true)
		if err != nil {
			t.Fatal(err)
		}
		_, rs2, err := DecodeBatch(again)
		if err != nil || len(rs2) != len(rs) {
			t.Fatalf("re-encoded batch: %v (%d vs %d records)", err, len(rs2), len(rs))
		}
		for i := range rs {
			if rs[i].Offset != rs2[i].Offset || !bytes.Equal(rs[i].Key, rs2[i].Key) || !bytes.Equal(rs[i].Value, rs2[i].Value) ||
				(rs[i].Key == nil) != (rs2[i].Key == nil) || (h.Attributes&attrLogAppendTime == 0 && !rs[i].Timestamp.Equal(rs2[i].Timestamp)) {
				t.Fatalf("record %d changed: %+v vs %+v", i, rs[i], rs2[i])
			}
		}
	})
}

// FuzzRecover writes arbitrary bytes after a valid prefix of batches as the
// active segment, opens the broker, and checks that it never panics, keeps
// the valid prefix, and accepts and serves a new append.
func FuzzRecover(f *testing.F) {
	prefix := EncodeBatch(5, 0, 0, recs("p", 2))
	prefix = append(prefix, EncodeBatch(5, 0, 2, recs("q", 2))...)
	setBaseOffset(prefix[len(prefix)/2:], 2)
	f.Add([]byte{})
	f.Add(make([]byte, 100))
	f.Add(EncodeBatch(5, 0, 4, recs("t", 1))[:40])
	next := EncodeBatch(5, 0, 4, recs("t", 1))
	setBaseOffset(next, 4)
	f.Add(next)
	f.Fuzz(func(t *testing.T, tail []byte) {
		dir := t.TempDir()
		pdir := partitionDir(dir, "z", 0)
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			t.Fatal(err)
		}
		meta := `{"version":1,"next_producer_id":1,"topics":{"z":{"partitions":1,"retention_ms":-1,"retention_bytes":-1,"cleanup_policy":"delete","segment_bytes":1073741824,"segment_ms":604800000,"delete_retention_ms":86400000,"max_message_bytes":1048588}}}`
		if err := os.WriteFile(dir+"/"+metaFile, []byte(meta), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(segmentName(pdir, 0, logSuffix), append(append([]byte(nil), prefix...), tail...), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Open(context.Background(), Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer b.Close()
		_, hw, _ := b.Offsets("z", 0)
		if hw < 4 {
			t.Fatalf("valid prefix lost: hw %d", hw)
		}
		// Whole batches in the tail that fail their CRC are reported
		// lost, above the valid prefix; everything else reads back.
		lost, _ := b.Lost("z", 0)
		for _, r := range lost {
			if r.First < 4 {
				t.Fatalf("valid prefix reported lost: %+v", lost)
			}
		}
		readAround(t, b, "z", 0)
		res, err := b.Append(context.Background(), "z", 0, EncodeBatch(-1, -1, -1, []Record{{Value: []byte("after"), Timestamp: time.UnixMilli(1)}}))
		if err != nil || res.BaseOffset != hw {
			t.Fatalf("append after recovery: %+v %v", res, err)
		}
		got, _ := readAround(t, b, "z", 0)
		if got[len(got)-1] != "after" {
			t.Fatalf("last record %q", got[len(got)-1])
		}
	})
}

// FuzzValidateProduced checks that validating a produced batch (which walks
// records over a pooled buffer) accepts exactly the batches that decode into
// records, and on compacted topics exactly those whose records all have
// keys.
func FuzzValidateProduced(f *testing.F) {
	f.Add(EncodeBatch(1, 0, 0, recs("f", 3)))
	keyless := recs("k", 3)
	keyless[1].Key = nil
	for _, c := range []Compression{CompressionNone, CompressionGzip, CompressionSnappy, CompressionLZ4, CompressionZstd} {
		b, _ := AppendBatch(nil, BatchOptions{ProducerID: -1, Compression: c}, recs("f", 2))
		f.Add(b)
		b, _ = AppendBatch(nil, BatchOptions{ProducerID: -1, Compression: c}, keyless)
		f.Add(b)
	}
	f.Add([]byte{})
	deleteCfg := TopicConfig{}.withDefaults(1)
	compactCfg := TopicConfig{CleanupPolicy: CleanupCompact}.withDefaults(1)
	f.Fuzz(func(t *testing.T, data []byte) {
		batch := append([]byte(nil), data...)
		_, compactErr := validateProduced(batch, compactCfg, false)
		_, deleteErr := validateProduced(batch, deleteCfg, false)
		h, rs, decErr := DecodeBatch(data)
		if decErr != nil {
			if compactErr == nil {
				t.Fatalf("compacted topic accepted a batch that does not decode: %v", decErr)
			}
			if deleteErr == nil && h.Compression() != CompressionNone {
				t.Fatalf("accepted a compressed batch that does not decode: %v", decErr)
			}
			return
		}
		hasKeys := true
		for _, r := range rs {
			hasKeys = hasKeys && r.Key != nil
		}
		if compactErr == nil && !hasKeys {
			t.Fatal("compacted topic accepted a keyless record")
		}
		if deleteErr == nil && compactErr != nil && hasKeys {
			t.Fatalf("compacted topic refused a keyed batch: %v", compactErr)
		}
	})
}
