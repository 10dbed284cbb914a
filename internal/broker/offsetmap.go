package broker

import (
	"crypto/sha256"
	"encoding/binary"
	"math/bits"
)

// keyHash is the 128-bit hash compaction tracks a key by.
type keyHash [16]byte

func hashKey(k []byte) keyHash {
	sum := sha256.Sum256(k)
	var h keyHash
	copy(h[:], sum[:])
	return h
}

// offsetMap is compaction's key map, as Kafka's SkimpyOffsetMap: an
// open-addressing hash table of 24-byte slots (the key's 128-bit hash and
// the offset of its newest record) in one pointer-free array, so it costs
// about 27 bytes per key at its 0.9 load limit and nothing for the garbage
// collector to scan. It starts small and doubles up to maxSlots; once full
// there, put refuses and compaction cleans what the map covers, then
// builds it again from there (a second pass; see compact).
type offsetMap struct {
	slots    []offsetSlot
	used     int
	maxSlots int
}

// offsetSlot holds a key hash and its newest offset plus one (0: empty).
type offsetSlot struct {
	h   keyHash
	off int64
}

const (
	offsetSlotBytes    = 24
	offsetMapMinSlots  = 1 << 10
	offsetMapLoadLimit = 0.9
)

// newOffsetMap returns an empty map that grows to at most maxBytes.
func newOffsetMap(maxBytes int64) *offsetMap {
	maxSlots := int(max(maxBytes/offsetSlotBytes, offsetMapMinSlots))
	return &offsetMap{slots: make([]offsetSlot, min(offsetMapMinSlots, maxSlots)), maxSlots: maxSlots}
}

// room says whether n more keys surely fit (growing the map if need be).
// An empty map always makes room, past its bound if it must, so that one
// batch of more records than the bound allows still gets compacted.
func (m *offsetMap) room(n int) bool {
	for float64(m.used+n) > offsetMapLoadLimit*float64(len(m.slots)) {
		switch {
		case len(m.slots) < m.maxSlots:
			m.grow(min(2*len(m.slots), m.maxSlots))
		case m.used == 0:
			m.grow(2 * len(m.slots))
		default:
			return false
		}
	}
	return true
}

func (m *offsetMap) grow(n int) {
	old := m.slots
	m.slots, m.used = make([]offsetSlot, n), 0
	for _, s := range old {
		if s.off != 0 {
			m.put(s.h, s.off-1)
		}
	}
}

// home is the first slot probed for h.
func (m *offsetMap) home(h keyHash) int {
	hi, _ := bits.Mul64(binary.LittleEndian.Uint64(h[:8]), uint64(len(m.slots)))
	return int(hi)
}

// put records offset as h's newest; the caller made room.
func (m *offsetMap) put(h keyHash, offset int64) {
	for i := m.home(h); ; i++ {
		if i == len(m.slots) {
			i = 0
		}
		s := &m.slots[i]
		if s.off == 0 {
			s.h, s.off = h, offset+1
			m.used++
			return
		}
		if s.h == h {
			s.off = offset + 1
			return
		}
	}
}

// get returns h's newest offset.
func (m *offsetMap) get(h keyHash) (int64, bool) {
	for i := m.home(h); ; i++ {
		if i == len(m.slots) {
			i = 0
		}
		s := &m.slots[i]
		if s.off == 0 {
			return 0, false
		}
		if s.h == h {
			return s.off - 1, true
		}
	}
}

// reset empties the map, keeping its slots.
func (m *offsetMap) reset() {
	clear(m.slots)
	m.used = 0
}
