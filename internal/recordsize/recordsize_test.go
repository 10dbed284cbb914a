package recordsize

import (
	"encoding/binary"
	"math"
	"testing"
)

// TestVarintMatchesTheEncoding: every length is what encoding/binary's
// zig-zag varint encoder writes, at each boundary of the 7-bit groups.
func TestVarintMatchesTheEncoding(t *testing.T) {
	values := []int64{0, -1, 1, math.MinInt64, math.MaxInt64, math.MinInt32, math.MaxInt32}
	for shift := 0; shift < 63; shift++ {
		v := int64(1) << shift
		values = append(values, v-1, v, -v, -v-1)
	}
	for _, v := range values {
		if got, want := Varint(v), len(binary.AppendVarint(nil, v)); got != want {
			t.Errorf("Varint(%d) = %d; the encoding has %d bytes", v, got, want)
		}
	}
}

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		b    []byte
		want int
	}{{nil, 1}, {[]byte{}, 1}, {make([]byte, 63), 64}, {make([]byte, 64), 66}, {make([]byte, 300), 302}} {
		if got := Bytes(c.b); got != c.want {
			t.Errorf("Bytes(%d bytes, nil %v) = %d; want %d", len(c.b), c.b == nil, got, c.want)
		}
	}
}
