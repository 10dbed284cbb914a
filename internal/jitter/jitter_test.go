package jitter

import (
	"testing"
	"time"
)

// TestSpread: every wait lies in [d/2, d], and they differ.
func TestSpread(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 1} {
		if got := Spread(d); got != d {
			t.Errorf("Spread(%v) = %v; want it unchanged", d, got)
		}
	}
	for _, d := range []time.Duration{2, 3, 200 * time.Millisecond, 10 * time.Second} {
		seen := map[time.Duration]bool{}
		for range 200 {
			w := Spread(d)
			if w < d/2 || w > d {
				t.Fatalf("Spread(%v) = %v, outside [%v, %v]", d, w, d/2, d)
			}
			seen[w] = true
		}
		if len(seen) < 2 {
			t.Errorf("Spread(%v) returned %v every time", d, seen)
		}
	}
}
