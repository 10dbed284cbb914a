package broker

import "encoding/binary"

// PartitionForKey is Kafka's default partitioner for keyed records:
// murmur2(key) made positive, modulo the partition count. It matches the Java
// client and franz-go's StickyKeyPartitioner, so a key lands on the same
// partition number in the embedded broker and in Kafka. n <= 0 yields 0.
func PartitionForKey(key []byte, n int32) int32 {
	if n <= 0 {
		return 0
	}
	return int32((murmur2(key) & 0x7fffffff) % uint32(n))
}

// murmur2 is the 32-bit MurmurHash2 variant with Kafka's seed.
func murmur2(b []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	h := uint32(seed) ^ uint32(len(b))
	for len(b) >= 4 {
		k := binary.LittleEndian.Uint32(b)
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
