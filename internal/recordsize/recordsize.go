// Package recordsize measures the fields of a Kafka v2 record as they are
// encoded: zig-zag varints and nullable byte fields (a varint length, -1
// for null, then the bytes). The embedded broker's batch encoder
// (internal/broker) and the Kafka sink's size bound (internal/sink/kafka)
// share these, so the two measure a record alike.
package recordsize

import "github.com/twmb/franz-go/pkg/kbin"

// Varint is the encoded length of v as a zig-zag varint.
func Varint(v int64) int { return kbin.VarlongLen(v) }

// Bytes is the encoded length of a nullable byte field holding b (nil is
// null).
func Bytes(b []byte) int {
	if b == nil {
		return Varint(-1)
	}
	return Varint(int64(len(b))) + len(b)
}
