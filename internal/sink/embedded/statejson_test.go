package embedded

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkStateJSON encodes the state of 1,000 topics of 8 partitions,
// which goes with every batch made durable, with appendJSON and with
// encoding/json.
func BenchmarkStateJSON(b *testing.B) {
	s := state{LogID: "0123456789abcdef", ProducerID: 1 << 40, Acked: map[string]map[int32]int64{}}
	for i := range 1000 {
		offsets := map[int32]int64{}
		for p := range int32(8) {
			offsets[p] = int64(i)*1_000_000 + int64(p)
		}
		s.Acked[fmt.Sprintf("bench-%d", i)] = offsets
	}
	b.Run("appendJSON", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = s.appendJSON(buf[:0]); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(s); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStateJSONMatchesEncodingJSON checks appendJSON against encoding/json
// on random states: with and without a log id and held records, topics of
// up to 25 partitions (where "10" sorts before "2"), names that need
// escaping, and offsets at the int64 limits.
func TestStateJSONMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	names := []string{"orders", "a.b_c-D9", "", "é", "<tag>&", `quo"te`, "x\ny", "bench-1", "bench-10", "bench-2"}
	offsets := []int64{0, 1, -1, 9, 10, 1 << 31, 1<<63 - 1, -1 << 63}
	for i := range 2000 {
		s := state{ProducerID: r.Int64N(1<<40) - 5, Acked: map[string]map[int32]int64{}}
		if r.IntN(2) == 0 {
			s.LogID = fmt.Sprintf("%016x", r.Uint64())
		}
		for range r.IntN(6) {
			topic := names[r.IntN(len(names))]
			if s.Acked[topic] == nil {
				s.Acked[topic] = map[int32]int64{}
			}
			n := r.IntN(25)
			for range n {
				s.Acked[topic][int32(r.IntN(n+1))] = offsets[r.IntN(len(offsets))] + r.Int64N(3)
			}
		}
		switch r.IntN(4) {
		case 0:
			s.Acked = nil
		case 1:
			s.Held = []heldRange{{Topic: names[r.IntN(len(names))], Partition: 3, Producer: 7, From: 5, To: 9}}
		}
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.appendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("state %d:\n got %s\nwant %s", i, got, want)
		}
	}
}
