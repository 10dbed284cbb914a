package broker

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkEncodeBatch encodes what the relay's sink hands the broker: 1000
// outbox events of 200 B with the relay's two headers.
func BenchmarkEncodeBatch(b *testing.B) {
	records := make([]Record, 1000)
	for i := range records {
		records[i] = Record{
			Key:   fmt.Appendf(nil, "key-%d", i),
			Value: make([]byte, 200),
			Headers: []Header{
				{Key: "relay-event-id", Value: []byte("0b8f3c1e-5d0a-4a57-9d3e-2f4c6a8b9e10")},
				{Key: "relay-created-at", Value: []byte("2026-12-01T04:26:57.098123Z")},
			},
			Timestamp: time.UnixMilli(1_760_000_000_000 + int64(i)),
		}
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(EncodeBatch(1, 0, 0, records))))
	for b.Loop() {
		EncodeBatch(1, 0, 0, records)
	}
}
