package idlemem

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

var sink [][]byte

// report sends each trim's heap to ch, dropping it when ch is full (Watch
// must never block on the test).
func report(ch chan uint64) func(uint64) {
	return func(h uint64) {
		select {
		case ch <- h:
		default:
		}
	}
}

// churn allocates n MiB in 1 MiB buffers, touching each page, and keeps
// them reachable until the next churn.
func churn(n int) {
	sink = sink[:0]
	for range n {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		sink = append(sink, b)
	}
}

// TestWatchReturnsIdleMemory: a heap grown by a busy phase is collected
// and given back once the process idles, at the idle growth, and the busy
// growth comes back with work.
func TestWatchReturnsIdleMemory(t *testing.T) {
	old := debug.SetGCPercent(400)
	defer debug.SetGCPercent(old)
	trimmed := make(chan uint64, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, Config{Interval: 100 * time.Millisecond, Trimmed: report(trimmed)})
	}()
	defer func() { cancel(); <-done }()

	churn(64) // 64 MiB live, then garbage
	// Read while the 64 MiB are still live: none of it can be released
	// yet. Trims reported before the work are dropped; one from now until
	// sink is cleared reports at least 64 MiB of heap, which the loop
	// below passes over.
	releasedBefore := readMetric("/memory/classes/heap/released:bytes")
	for len(trimmed) > 0 {
		<-trimmed
	}
	sink = nil
	timeout := time.After(10 * time.Second)
	for heap := uint64(64 << 20); heap > 32<<20; {
		select {
		case heap = <-trimmed:
		case <-timeout:
			t.Fatalf("no idle collection left less than 32 MiB of heap 10 s after the work stopped (last: %d MiB)", heap>>20)
		}
	}
	if released := readMetric("/memory/classes/heap/released:bytes"); released < releasedBefore+32<<20 {
		t.Fatalf("released %d MiB to the system, want at least 32 of the 64 freed", (released-releasedBefore)>>20)
	}
	if p := readMetric("/gc/gogc:percent"); p != 100 {
		t.Fatalf("GOGC %d while idle, want 100", p)
	}

	deadline := time.Now().Add(10 * time.Second)
	for readMetric("/gc/gogc:percent") != 400 {
		if time.Now().After(deadline) {
			t.Fatal("GOGC did not return to 400 with the process busy again")
		}
		churn(8)
	}
	sink = nil
}

// TestWatchKeepsPercent: with KeepPercent (GOGC set by the operator) the
// growth is left alone and memory is still returned.
func TestWatchKeepsPercent(t *testing.T) {
	old := debug.SetGCPercent(250)
	defer debug.SetGCPercent(old)
	trimmed := make(chan uint64, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, Config{Interval: 100 * time.Millisecond, KeepPercent: true, Trimmed: report(trimmed)})
	}()
	defer func() { cancel(); <-done }()
	churn(16)
	sink = nil
	select {
	case <-trimmed:
	case <-time.After(10 * time.Second):
		t.Fatal("no memory returned 10 s after the work stopped")
	}
	if p := readMetric("/gc/gogc:percent"); p != 250 {
		t.Fatalf("GOGC %d, want the operator's 250 kept", p)
	}
}
