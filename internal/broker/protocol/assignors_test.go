package protocol

import (
	"slices"
	"testing"
)

// TestAssignors: range splits each topic into contiguous ranges in member
// order; uniform balances to within one partition, keeps what it can of
// the previous target, and gives each partition only to a subscriber.
func TestAssignors(t *testing.T) {
	t.Parallel()
	subs := map[string][]string{"a": {"t"}, "b": {"t"}, "c": {"t"}}
	counts := map[string]int32{"t": 7}
	r := assignRange(subs, counts)
	for id, want := range map[string][]int32{"a": {0, 1, 2}, "b": {3, 4}, "c": {5, 6}} {
		if !slices.Equal(r[id]["t"], want) {
			t.Errorf("range %s = %v, want %v", id, r[id]["t"], want)
		}
	}

	u := assignUniform(subs, counts, nil)
	total := 0
	for _, a := range u {
		if n := a.count(); n < 2 || n > 3 {
			t.Errorf("uniform gave %d partitions: %v", n, u)
		}
		total += a.count()
	}
	if total != 7 {
		t.Fatalf("uniform assigned %d of 7: %v", total, u)
	}
	// c leaves: a and b keep everything they had.
	next := assignUniform(map[string][]string{"a": {"t"}, "b": {"t"}}, counts, u)
	for _, id := range []string{"a", "b"} {
		u[id].each(func(tn string, p int32) {
			if !next[id].has(tn, p) {
				t.Errorf("uniform moved %s-%d away from %s after another member left: %v -> %v", tn, p, id, u, next)
			}
		})
	}
	if next["a"].count()+next["b"].count() != 7 || max(next["a"].count(), next["b"].count()) != 4 {
		t.Errorf("uniform after a leave: %v", next)
	}
	// Mixed subscriptions: only subscribers get a topic's partitions.
	mixed := assignUniform(map[string][]string{"a": {"t", "u"}, "b": {"t"}}, map[string]int32{"t": 2, "u": 4}, nil)
	if len(mixed["b"]["u"]) != 0 || len(mixed["a"]["u"]) != 4 || mixed["a"].count()+mixed["b"].count() != 6 || mixed["b"].count() != 2 {
		t.Errorf("uniform with mixed subscriptions: %v", mixed)
	}
}
