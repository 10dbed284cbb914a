package poller

import "math"

// minKey sorts before every commit timestamp; a transaction without one
// gets it (relay/store's commit-timestamp reads give it the same value).
const minKey = math.MinInt64
