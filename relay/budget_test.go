package relay

import (
	"context"
	"testing"
	"time"
)

func TestSplitBytes(t *testing.T) {
	ev := func(n int) Event { return Event{Payload: make([]byte, n)} }
	events := []Event{ev(40), ev(50), ev(20), ev(150), ev(10), ev(90), ev(5)}
	var got [][]int
	for _, run := range splitBytes(events, 100) {
		var sizes []int
		for _, e := range run {
			sizes = append(sizes, len(e.Payload))
		}
		got = append(got, sizes)
	}
	want := [][]int{{40, 50}, {20}, {150}, {10, 90}, {5}}
	if len(got) != len(want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("runs %v, want %v", got, want)
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("runs %v, want %v", got, want)
			}
		}
	}
}

// TestByteBudgetBlocksUntilReleased: a batch waits while the bytes in
// flight would go above the budget, and one larger than the whole budget
// waits until nothing else is in flight, then goes alone.
func TestByteBudgetBlocksUntilReleased(t *testing.T) {
	b := newByteBudget(100) // maxInFlight batches of 100 bytes
	ctx := context.Background()
	first, err := b.acquire(ctx, 300)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan int64)
	go func() {
		n, err := b.acquire(ctx, 10_000)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	select {
	case <-got:
		t.Fatal("a batch larger than the budget went while 300 bytes were in flight")
	case <-time.After(50 * time.Millisecond):
	}
	b.release(first)
	if n := <-got; n != b.capacity {
		t.Fatalf("the large batch took %d bytes, want the whole budget %d", n, b.capacity)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := b.acquire(short, 1); err == nil {
		t.Fatal("a byte was taken while the whole budget was held")
	}
}
