// Package testwait is the tests' condition poll: wait until a state holds
// rather than sleep for a guessed time. A test that waits with it names
// the state it waits for, and fails with that name and the last reason
// the state did not hold.
package testwait

import (
	"testing"
	"time"
)

// Interval is how often Until and For ask again.
const Interval = 10 * time.Millisecond

// Until calls check every Interval until it returns nil, and fails the
// test, naming what and check's last error, when it has not within.
func Until(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not after %v: %v", what, within, err)
		}
		<-tick.C
	}
}

// For calls cond every Interval until it returns true, and fails the
// test, naming what, when it has not within.
func For(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not after %v", what, within)
		}
		<-tick.C
	}
}

// Poll calls cond every Interval until it returns true or within has
// passed, and reports whether it did: for a state that a test expects
// may never come (and judges itself).
func Poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
