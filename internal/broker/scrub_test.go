package broker

import (
	"testing"
	"time"
)

// TestScrubWaitsAfterOpen: the background check's first pass comes a
// ScrubPause after the open, not at once (an open is often followed by a
// drain it would slow), and does come then.
func TestScrubWaitsAfterOpen(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pause time.Duration
		runs  bool
	}{{time.Hour, false}, {50 * time.Millisecond, true}} {
		dir := t.TempDir()
		b := openWithTopic(t, dir, nil, "t", TopicConfig{Partitions: 1})
		mustAppend(t, b, "t", 0, EncodeBatch(-1, 0, 0, recs("a", 10)))
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		b = openTest(t, dir, func(o *Options) { o.ScrubBytesPerSecond, o.ScrubPause = 1<<30, c.pause })
		deadline := time.Now().Add(500 * time.Millisecond)
		if c.runs {
			deadline = time.Now().Add(time.Minute)
		}
		for time.Now().Before(deadline) && b.ScrubStatus().Passes == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		st := b.ScrubStatus()
		if c.runs && (st.Passes == 0 || st.BytesChecked == 0) {
			t.Fatalf("pause %v: no pass within a minute (%+v)", c.pause, st)
		}
		if !c.runs && (st.Passes != 0 || st.BytesChecked != 0) {
			t.Fatalf("pause %v: the check ran within 500 ms of the open (%+v)", c.pause, st)
		}
	}
}
