package relay

import (
	"slices"
	"testing"
)

func TestIDRuns(t *testing.T) {
	for _, c := range []struct {
		ids         []int64
		lo, hi, one []int64
	}{
		{ids: nil},
		{ids: []int64{7}, one: []int64{7}},
		{ids: []int64{3, 1, 2}, one: []int64{1, 2, 3}},
		{ids: []int64{5, 4, 3, 2}, lo: []int64{2}, hi: []int64{5}},
		{ids: []int64{10, 1, 2, 3, 4, 9, 20, 21, 22, 23, 24, 4}, lo: []int64{1, 20}, hi: []int64{4, 24}, one: []int64{9, 10}},
	} {
		runs := idRunsOf(c.ids)
		if !slices.Equal(runs.lo, c.lo) || !slices.Equal(runs.hi, c.hi) || !slices.Equal(runs.singles, c.one) {
			t.Errorf("idRunsOf(%v) = lo %v hi %v singles %v; want lo %v hi %v singles %v", c.ids, runs.lo, runs.hi, runs.singles, c.lo, c.hi, c.one)
		}
		covered := len(runs.singles)
		for i := range runs.lo {
			covered += int(runs.hi[i] - runs.lo[i] + 1)
		}
		if covered != runs.count || runs.count != len(slices.Compact(slices.Sorted(slices.Values(c.ids)))) {
			t.Errorf("idRunsOf(%v) covers %d ids, counts %d", c.ids, covered, runs.count)
		}
	}
}
