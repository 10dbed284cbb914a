package faults_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
)

// TestPausedLeaderResumes: the leader is SIGSTOPped for 6 leases (past its
// lease and the idle-in-transaction timeout that ends a transaction it
// left open) while 8 writers commit. The standby takes over within
// takeoverBound, and waits for the data directory that the stopped process
// holds. After SIGCONT the old process commits no acknowledgement and
// appends nothing: the checkpoint does not move until the new leader's
// pipeline starts, and every batch of the old process's producer epoch in
// the final log was there when it was stopped. Then the new leader drains:
// every event exactly once, in per-key order; the old process rejoins as
// standby.
func TestPausedLeaderResumes(t *testing.T) {
	e := newEnv(t)
	a, b, ledger, stopWriters := e.pairUnderLoad()

	a.proc.Signal(syscall.SIGSTOP)
	stopped := time.Now()
	took := waitFor(t, takeoverBound, "the standby to take over from the stopped leader", func() bool { return b.proc.Role() == "leader" })
	// What the stopped process had written.
	time.Sleep(200 * time.Millisecond) // deliberate pause: lets the stopped process's last writes reach the disk before the snapshot
	snapshot := filepath.Join(t.TempDir(), "snapshot")
	if out, err := exec.Command("cp", "-a", e.dataDir, snapshot).CombinedOutput(); err != nil {
		t.Fatalf("copying the data directory: %v: %s", err, out)
	}
	time.Sleep(time.Until(stopped.Add(6 * lease))) // deliberate pause: six leases in which the new pipeline must not start (a negative check)
	if strings.Contains(b.proc.Output(), "pipeline started") {
		t.Fatalf("the new leader's pipeline started while the old process held the data directory:\n%s", b.proc.Output())
	}
	before := e.published()

	a.proc.Signal(syscall.SIGCONT)
	resumed := time.Now()
	checks := 0
	waitFor(t, time.Minute, "the new leader's pipeline to start", func() bool {
		// Read the checkpoint before looking at the new leader's log: if the
		// pipeline had not started then, only the old process could have
		// moved it.
		now := e.published()
		if strings.Contains(b.proc.Output(), "pipeline started") {
			return true
		}
		checks++
		if now.count != before.count || !now.updated.Equal(before.updated) {
			t.Fatalf("the checkpoint moved from %+v to %+v after SIGCONT, before the new leader's pipeline started: the old leader acknowledged", before, now)
		}
		return false
	})
	started := time.Since(resumed)
	stopWriters()
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	e2e.WaitRole(t, a.proc, "standby", 30*time.Second)
	a.stop()
	b.stop()
	n := e.checkAll(ledger)

	final := readBatches(t, e.dataDir, "orders")
	checkEpochOrder(t, final)
	old := readBatches(t, snapshot, "orders")
	if len(old) == 0 {
		t.Fatal("the copy of the data directory taken while the leader was stopped holds no batch")
	}
	var oldEpoch int16 = -1
	had := map[[3]int64]bool{}
	for _, bt := range old {
		oldEpoch = max(oldEpoch, bt.epoch)
		had[[3]int64{int64(bt.partition), bt.base, bt.last}] = true
	}
	for _, bt := range final {
		if bt.epoch <= oldEpoch && !had[[3]int64{int64(bt.partition), bt.base, bt.last}] {
			t.Errorf("partition %d: batch %d..%d of epoch %d (the stopped process's is %d) was appended after SIGSTOP", bt.partition, bt.base, bt.last, bt.epoch, oldEpoch)
		}
	}
	t.Logf("standby took over %v after SIGSTOP; after SIGCONT the checkpoint stayed put (%d reads) until the new leader's pipeline started %v later; %d events exactly once in per-key order; the stopped process's epoch %d appended nothing after SIGSTOP",
		took.Round(time.Millisecond), checks, started.Round(time.Millisecond), n, oldEpoch)
}
