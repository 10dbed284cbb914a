package faults_test

import (
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
)

// TestPartitionedLeader: each relay reaches PostgreSQL through its own
// proxy; the leader's proxy stops forwarding without closing anything (a
// silent partition) while 8 writers commit. Within takeoverBound the
// standby takes over and the old leader stops leading (its lease ran out,
// its pipeline stopped); it releases the data directory while still
// partitioned, so the new leader publishes and
// acknowledges new events before the partition heals; no batch of the old
// leader's producer epoch follows one of the new leader's. After the heal
// the old leader rejoins as standby, and the log holds every event exactly
// once in per-key order.
func TestPartitionedLeader(t *testing.T) {
	e := newEnv(t)
	a, b, ledger, stopWriters := e.pairUnderLoad()

	a.proxy.Blackhole()
	partitioned := time.Now()
	// Watch both at once: the standby taking over, the old leader ceasing
	// to lead (its pipeline stopped: no append, no acknowledgement).
	var took, oldStopped time.Duration
	waitFor(t, takeoverBound, "the standby to take over and the old leader to stop leading", func() bool {
		if took == 0 && b.proc.Role() == "leader" {
			took = time.Since(partitioned)
		}
		if oldStopped == 0 && e2e.Metric(t, a.addr, "relay_leader") == 0 {
			oldStopped = time.Since(partitioned)
		}
		return took > 0 && oldStopped > 0
	})
	waitFor(t, releaseBound, "the new leader's pipeline to start", func() bool { return strings.Contains(b.proc.Output(), "pipeline started") })
	pipelineAt := time.Since(partitioned)
	// The new leader acknowledges new events while the partition lasts.
	before := e.published()
	waitFor(t, 30*time.Second, "the new leader to acknowledge events", func() bool { return e.published().count > before.count })
	ackedAt := time.Since(partitioned)
	if got := a.proc.Role(); got == "leader" {
		t.Fatalf("the partitioned relay still says it leads %v into the partition", time.Since(partitioned))
	}
	time.Sleep(time.Until(partitioned.Add(ackedAt + 3*time.Second))) // simulates a partition that lasts 3 s past the first acknowledgement
	a.proxy.Heal()

	e2e.WaitRole(t, a.proc, "standby", 30*time.Second)
	stopWriters()
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	a.stop()
	b.stop()
	n := e.checkAll(ledger)
	epochs := checkEpochOrder(t, readBatches(t, e.dataDir, "orders"))
	t.Logf("after the partition started: the standby led at %v (bound %v), the old leader stopped leading at %v, the new pipeline started at %v and acknowledged at %v; %d events exactly once in per-key order, %d producer epochs in order",
		took.Round(time.Millisecond), takeoverBound, oldStopped.Round(time.Millisecond), pipelineAt.Round(time.Millisecond), ackedAt.Round(time.Millisecond), n, epochs)
}
