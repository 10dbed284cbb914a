package embedded

import (
	"cmp"
	"slices"
	"strings"
)

type tp struct {
	topic     string
	partition int32
}

// logPos is where a record is in the log, and which producer id wrote
// it.
type logPos struct {
	key      tp
	offset   int64
	producer int64
}

// state is what the core saves with each acknowledgement.
type state struct {
	LogID      string `json:"log_id,omitempty"`
	ProducerID int64  `json:"producer_id"`
	// Acked is, per topic and partition, the offset just after the relay's
	// last durable batch when this state was made: the relay's batches at
	// or after it may be unacknowledged.
	Acked map[string]map[int32]int64 `json:"acked,omitempty"`
	// Held are the relay's records below Acked that may be unacknowledged
	// too: found so at a session's Start and not yet offered again in a
	// batch made durable since.
	Held []heldRange `json:"held,omitempty"`
}

// heldRange is a run of held records: offsets From to To (exclusive) of
// one partition, written by Producer.
type heldRange struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Producer  int64  `json:"producer"`
	From      int64  `json:"from"`
	To        int64  `json:"to"`
}

func (s *state) acked(k tp) (int64, bool) {
	off, ok := s.Acked[k.topic][k.partition]
	return off, ok
}

func (s *state) setAcked(k tp, off int64) {
	if s.Acked[k.topic] == nil {
		s.Acked[k.topic] = map[int32]int64{}
	}
	s.Acked[k.topic][k.partition] = off
}

// withHeld is s naming the records of held, as runs of offsets.
func (s state) withHeld(held map[string]logPos) state {
	if len(held) == 0 {
		return s
	}
	type run struct {
		key      tp
		producer int64
	}
	offsets := map[run][]int64{}
	for _, pos := range held {
		r := run{pos.key, pos.producer}
		offsets[r] = append(offsets[r], pos.offset)
	}
	s.Held = nil
	for r, offs := range offsets {
		slices.Sort(offs)
		from := offs[0]
		for i, off := range offs {
			if i+1 == len(offs) || offs[i+1] != off+1 {
				s.Held = append(s.Held, heldRange{Topic: r.key.topic, Partition: r.key.partition, Producer: r.producer, From: from, To: off + 1})
				if i+1 < len(offs) {
					from = offs[i+1]
				}
			}
		}
	}
	slices.SortFunc(s.Held, func(a, b heldRange) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.From, b.From))
	})
	return s
}
