// Package jitter spreads retry waits, so that processes that failed
// together (relays that lost the same database, readers of one server
// that restarted) do not retry in step.
package jitter

import (
	"math/rand/v2"
	"time"
)

// Spread returns a wait drawn uniformly from [d/2, d]: the exponential
// backoff's ceiling stays d, and half of it is random. d <= 0 is
// returned as it is.
func Spread(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	half := d / 2
	return d - half + rand.N(half+1)
}
