package embedded

import (
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
)

// appendJSON appends s as encoding/json encodes it, byte for byte. The
// state goes with every batch made durable, and with thousands of
// partitions encoding/json's reflection and its sorting of every topic's
// partition keys as strings were a visible share of the sink's CPU time
// per event (BenchmarkPublish, topics=1000).
func (s state) appendJSON(b []byte) ([]byte, error) {
	b = append(b, '{')
	if s.LogID != "" {
		b = append(b, `"log_id":`...)
		b = appendJSONString(b, s.LogID)
		b = append(b, ',')
	}
	b = append(b, `"producer_id":`...)
	b = strconv.AppendInt(b, s.ProducerID, 10)
	if len(s.Acked) > 0 {
		b = append(b, `,"acked":{`...)
		var parts []int32
		for i, topic := range slices.Sorted(maps.Keys(s.Acked)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, topic)
			b = append(b, ":{"...)
			offsets := s.Acked[topic]
			parts = slices.AppendSeq(parts[:0], maps.Keys(offsets))
			sortAsDecimalStrings(parts)
			for j, p := range parts {
				if j > 0 {
					b = append(b, ',')
				}
				b = append(b, '"')
				b = strconv.AppendInt(b, int64(p), 10)
				b = append(b, `":`...)
				b = strconv.AppendInt(b, offsets[p], 10)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	if len(s.Held) > 0 {
		held, err := json.Marshal(s.Held)
		if err != nil {
			return nil, err
		}
		b = append(b, `,"held":`...)
		b = append(b, held...)
	}
	return append(b, '}'), nil
}

// sortAsDecimalStrings sorts partition numbers in the order encoding/json
// gives map keys, that of their decimal strings: "10" before "2".
func sortAsDecimalStrings(parts []int32) {
	slices.Sort(parts)
	if len(parts) > 0 && (parts[0] < 0 || parts[len(parts)-1] >= 10) {
		slices.SortFunc(parts, func(a, b int32) int {
			return cmp.Compare(strconv.Itoa(int(a)), strconv.Itoa(int(b)))
		})
	}
}

// appendJSONString appends s quoted. Topic names (and the broker's log id)
// are letters, digits, '.', '_' and '-', which JSON takes as they are;
// anything else goes through encoding/json, for its escapes.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
