package testwait

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestUntilWaitsForTheState: Until returns once check holds, after
// asking again as often as it had to.
func TestUntilWaitsForTheState(t *testing.T) {
	var calls atomic.Int32
	Until(t, time.Minute, "the third call", func() error {
		if calls.Add(1) < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls.Load() != 3 {
		t.Fatalf("%d calls; want 3", calls.Load())
	}
	calls.Store(0)
	For(t, time.Minute, "the second call", func() bool { return calls.Add(1) == 2 })
	if !Poll(time.Minute, func() bool { return true }) || Poll(3*Interval, func() bool { return false }) {
		t.Fatal("Poll reported the wrong outcome")
	}
}

// TestUntilFailsNamingTheState: a state that never holds fails the test
// with its name and the last reason.
func TestUntilFailsNamingTheState(t *testing.T) {
	ft := &fakeT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(ft, 3*Interval, "the impossible", func() error { return errors.New("never") })
	}()
	<-done
	if ft.msg == "" || !strings.Contains(ft.msg, "the impossible") || !strings.Contains(ft.msg, "never") {
		t.Fatalf("failure message %q", ft.msg)
	}
}

// fakeT records Fatalf and ends the goroutine as testing.T does.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
