package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/relay"
)

// spread returns events from to from+n-1 over 50 topics (wide-0 ..) and 16
// keys a topic: a page of 2,000 has a group for each of the 400 partitions,
// so its appends run side by side.
func spread(from, n int) []relay.Message {
	out := make([]relay.Message, 0, n)
	for i := from; i < from+n; i++ {
		out = append(out, relay.Message{
			Topic:     fmt.Sprintf("wide-%d", i%50),
			Key:       fmt.Appendf(nil, "key-%d", (i/50)%16),
			Value:     fmt.Appendf(nil, "event-%d", i),
			Headers:   []relay.Header{{Key: relay.HeaderEventID, Value: fmt.Appendf(nil, "id-%d", i)}},
			Timestamp: time.UnixMilli(int64(1_700_000_000_000 + i)),
		})
	}
	return out
}

// checkSpread reads the 50 topics back and checks that events 0 to n-1
// are each in the log once, and each key's in the order of their numbers.
func checkSpread(t *testing.T, dir string, n int) {
	t.Helper()
	seen := make([]int, n)
	for tp := range 50 {
		last := map[string]int{}
		for _, r := range e2e.ReadLog(t, dir, fmt.Sprintf("wide-%d", tp)) {
			i, err := strconv.Atoi(strings.TrimPrefix(string(r.Value), "event-"))
			if err != nil || i >= n {
				t.Fatalf("unexpected record %q", r.Value)
			}
			seen[i]++
			if prev, ok := last[r.Key]; ok && prev > i {
				t.Errorf("wide-%d key %s: event-%d after event-%d", tp, r.Key, i, prev)
			}
			last[r.Key] = i
		}
	}
	for i, c := range seen {
		if c != 1 {
			t.Errorf("event-%d is in the log %d times", i, c)
		}
	}
}

// TestAppendsSideBySide publishes pages spread over 400 partitions, whose
// appends the sink splits among goroutines: each event lands once and in
// its key's order, and the partitions' sequences carry on from page to
// page (a wrong one is refused by the broker). Then a session's fence
// fails in the middle of a page, with some groups appended and others
// not, and its acknowledgement is lost with the page before: a new
// session from the state saved before them, offered both pages again and
// one more, appends each missing event once and skips those in the log.
func TestAppendsSideBySide(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	ctx := context.Background()
	dir := t.TempDir()
	cfg := sinkConfig(dir)
	cfg.Broker.DefaultPartitions = 8
	s := openSink(t, cfg)
	var fences atomic.Int64
	failAt := int64(-1)
	fence := func() error {
		if n := fences.Add(1); failAt >= 0 && n >= failAt {
			return fmt.Errorf("%w: the test's fence", relay.ErrNotLeader)
		}
		return nil
	}
	if err := s.Start(ctx, relay.Session{Fence: fence}); err != nil {
		t.Fatal(err)
	}
	const page = 2000
	var saved []byte
	for p := range 3 {
		saved = publishOK(t, s, spread(p*page, page)).State
	}
	publishOK(t, s, spread(3*page, page)) // its acknowledgement is lost
	failAt = fences.Load() + 200
	_, err := s.Publish(ctx, spread(4*page, page))
	if !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("publish past the fence: %v, want ErrNotLeader", err)
	}
	s.Close(ctx)
	failAt = -1
	s = startedSink(t, dir, saved)
	for p := 3; p < 6; p++ {
		publishOK(t, s, spread(p*page, page))
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	checkSpread(t, dir, 6*page)
}
