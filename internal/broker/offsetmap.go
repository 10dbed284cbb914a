package broker

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/bits"
	"unsafe"

	"golang.org/x/sys/unix"
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
// the offset of its newest record) in one array, so it costs about 27
// bytes per key at its 0.9 load limit. It starts small and doubles up to
// maxSlots; once full there, room refuses and compaction cleans what the
// map covers, then builds it again from there (a second pass; see
// compact).
//
// The array is mapped memory (mmap), not Go heap: a heap array of
// hundreds of megabytes would raise the garbage collector's target by as
// much (GOGC), letting the garbage of decoding records grow to the map's
// size again before a collection; and a grown map's old array is
// returned to the system at once. free unmaps it.
type offsetMap struct {
	slots    []offsetSlot
	mem      []byte
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
func newOffsetMap(maxBytes int64) (*offsetMap, error) {
	maxSlots := int(max(maxBytes/offsetSlotBytes, offsetMapMinSlots))
	m := &offsetMap{maxSlots: maxSlots}
	var err error
	if m.slots, m.mem, err = mapSlots(min(offsetMapMinSlots, maxSlots)); err != nil {
		return nil, err
	}
	return m, nil
}

// mapSlots maps n zeroed slots.
func mapSlots(n int) ([]offsetSlot, []byte, error) {
	mem, err := unix.Mmap(-1, 0, n*offsetSlotBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("broker: compaction key map of %d bytes: %w", n*offsetSlotBytes, err)
	}
	return unsafe.Slice((*offsetSlot)(unsafe.Pointer(&mem[0])), n), mem, nil
}

// free returns the map's memory; the map is unusable after it.
func (m *offsetMap) free() {
	if m.mem != nil {
		_ = unix.Munmap(m.mem)
	}
	m.slots, m.mem = nil, nil
}

// room says whether n more keys surely fit (growing the map if need be).
// An empty map always makes room, past its bound if it must, so that one
// batch of more records than the bound allows still gets compacted.
func (m *offsetMap) room(n int) (bool, error) {
	for float64(m.used+n) > offsetMapLoadLimit*float64(len(m.slots)) {
		var err error
		switch {
		case len(m.slots) < m.maxSlots:
			err = m.grow(min(2*len(m.slots), m.maxSlots))
		case m.used == 0:
			err = m.grow(2 * len(m.slots))
		default:
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

func (m *offsetMap) grow(n int) error {
	slots, mem, err := mapSlots(n)
	if err != nil {
		return err
	}
	old, oldMem := m.slots, m.mem
	m.slots, m.mem, m.used = slots, mem, 0
	for _, s := range old {
		if s.off != 0 {
			m.put(s.h, s.off-1)
		}
	}
	_ = unix.Munmap(oldMem)
	return nil
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
