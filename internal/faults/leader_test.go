package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/relay"
)

// stallRenewals holds the leader lease row locked for d, so that no
// renewal can commit meanwhile: the leader's lease runs out while its
// process and its other sessions live, and a standby takes over when the
// lock goes.
func (e *env) stallRenewals(d time.Duration) {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.admin.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT * FROM outbox.leader_lease FOR UPDATE"); err != nil {
		e.t.Fatal(err)
	}
	time.Sleep(d) // deliberate pause: holds the lease row locked for d (the fault itself)
}

// killLeaderSessions runs one round of faults on the current leader of
// nodes: round%3 == 0 terminates its lease session, 1 terminates every
// session it has, 2 terminates its lease session and keeps the lease row
// locked for 1.5 leases so that it cannot renew (a takeover follows). It
// returns the leader it hit.
func killLeaderSessions(t *testing.T, e *env, round int, nodes ...*node) *node {
	t.Helper()
	leader := leaderOf(t, 30*time.Second, nodes...)
	app := relay.LeaseApplicationName
	if round%3 == 1 {
		app = ""
	}
	ended := 0
	// The lease session is opened again at the next renewal after an
	// earlier round; wait for it.
	waitFor(t, 10*time.Second, "a session of the leader to terminate", func() bool {
		ended = leader.terminate(app)
		return ended > 0
	})
	if round%3 == 2 {
		e.stallRenewals(lease * 3 / 2)
	}
	t.Logf("round %d: ended %d sessions (application_name %q) of relay %s", round+1, ended, app, leader.name)
	return leader
}

// killLeaderSessionsUnderLoad starts a and b as leader and standby, runs
// writers (events each, pause apart) until 2,000 events are published and
// through the six rounds of killLeaderSessions (each kind twice, 1.5 s
// apart), and stops the writers. It returns the epoch before the rounds.
func killLeaderSessionsUnderLoad(t *testing.T, e *env, ledger *e2e.Ledger, events int, pause time.Duration, a, b *node) (firstEpoch int64) {
	t.Helper()
	startPair(a, b)
	firstEpoch = e.epoch()
	stopWriters := e.steady(events, pause, ledger)
	e2e.WaitPublished(t, e.url, 2000, time.Minute)
	for round := 0; round < 6; round++ {
		killLeaderSessions(t, e, round, a, b)
		time.Sleep(1500 * time.Millisecond) // deliberate pause: time between the rounds of killed sessions
	}
	stopWriters()
	return firstEpoch
}

// TestLeaseSessionKilledWithStandby: two relays on one outbox and one data
// directory, 8 writers, and the leader's sessions killed 6 times: its lease
// session alone, all its sessions, and its lease session with renewals
// stalled past the lease (which makes the standby take over while the old
// leader's process lives and holds the data directory). The log holds
// every committed event exactly once in per-key order, and no session
// appended after a newer one.
func TestLeaseSessionKilledWithStandby(t *testing.T) {
	e := newEnv(t)
	ledger := e2e.NewLedger()
	a, b := e.newNode("a"), e.newNode("b")
	firstEpoch := killLeaderSessionsUnderLoad(t, e, ledger, 1000, 50*time.Millisecond, a, b)
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	takeovers := e.epoch() - firstEpoch
	a.stop()
	b.stop()
	n := e.checkAll(ledger)
	epochs := checkEpochOrder(t, readBatches(t, e.dataDir, "orders"))
	if takeovers < 2 {
		t.Errorf("%d takeovers; the two rounds that stalled renewals past the lease should each have made one", takeovers)
	}
	t.Logf("%d events exactly once in per-key order through 6 rounds of killed sessions: %d takeovers, %d producer epochs in the log, %d rolled-back events absent",
		n, takeovers, epochs, len(ledger.RolledBack))
}
