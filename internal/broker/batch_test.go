package broker

import (
	"encoding/binary"
	"testing"
)

// TestVarintMatchesBinary checks the inlined one- and two-byte paths of
// varint against encoding/binary, including truncated and overlong input.
func TestVarintMatchesBinary(t *testing.T) {
	var inputs [][]byte
	for _, v := range []int64{0, 1, -1, 63, -64, 64, -65, 8191, -8192, 8192, -8193, 1 << 40, -1 << 62} {
		inputs = append(inputs, binary.AppendVarint(nil, v), append(binary.AppendVarint(nil, v), 0x05))
	}
	inputs = append(inputs, nil, []byte{0x80}, []byte{0xff, 0xff}, []byte{0x81, 0x00}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	for _, in := range inputs {
		wantV, wantN := binary.Varint(in)
		gotV, gotN := varint(in)
		if gotV != wantV || gotN != wantN {
			t.Errorf("varint(%x) = %d, %d; binary.Varint = %d, %d", in, gotV, gotN, wantV, wantN)
		}
	}
}
