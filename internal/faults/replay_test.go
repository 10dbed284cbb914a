package faults_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/relay"
)

// TestReplayAcrossTakeovers: a `relay replay` of a 4,000-event window runs
// while 8 writers commit and the leader's sessions are killed round after
// round, 6 rounds at most (lease session, all sessions, lease session with
// renewals stalled past the lease), with a standby on the same data directory, so that the
// replay moves from leader to leader. The replay reports done with every
// event of the window; the log holds every live event exactly once in
// per-key order, and every event of the window replayed exactly once
// (header relay-replay), in its partition's original order.
func TestReplayAcrossTakeovers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	a, b := e.newNode("a", "--retain", "1h", "--batch-size", "50"), e.newNode("b", "--retain", "1h", "--batch-size", "50")
	startPair(a, b)
	firstEpoch := e.epoch()

	write := func(n int) {
		t.Helper()
		if err := e2e.Write(ctx, e.writers(n), ledger); err != nil {
			t.Fatal(err)
		}
	}
	write(1000)
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	since := e2e.DBNow(t, e.admin)
	write(4000)
	until := e2e.DBNow(t, e.admin)
	write(1000)
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	window := e2e.ArchivedWindow(t, e.admin, since, until, 4000)

	stopWriters := e.steady(200, 50*time.Millisecond, ledger)
	type result struct {
		out  string
		code int
		err  error
	}
	replayDone := make(chan result, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		r, err := testbin.Run(rctx, e.bin, nil, "replay", "--database-url", e.url, "--since", since.Format(time.RFC3339Nano),
			"--until", until.Format(time.RFC3339Nano), "--json", "--poll-interval", "50ms")
		replayDone <- result{r.Stdout + r.Stderr, r.Code, err}
	}()

	// The rounds are for a replay under way: wait until it has sent a
	// first chunk (a CI run under load killed all six rounds' sessions
	// before the leader had taken the request up, or after it was done).
	waitFor(t, time.Minute, "the replay to send its first chunk", func() bool {
		var done int64
		e.admin.QueryRow(ctx, `SELECT coalesce(max(done), 0) FROM outbox.replay_requests WHERE status = 'running'`).Scan(&done)
		return done > 0
	})
	var res result
	midReplay, rounds := 0, 0
	finished := false
	for ; rounds < 6 && !finished; rounds++ {
		var done, total int64
		e.admin.QueryRow(ctx, `SELECT coalesce(max(done), 0), coalesce(max(total), 0) FROM outbox.replay_requests WHERE status = 'running'`).Scan(&done, &total)
		killLeaderSessions(t, e, rounds, a, b)
		if done > 0 && done < total {
			midReplay++
			t.Logf("round %d landed mid-replay: %d of %d replayed", rounds+1, done, total)
		}
		select {
		case res = <-replayDone:
			finished = true
		case <-time.After(time.Second):
		}
	}
	if !finished {
		select {
		case res = <-replayDone:
		case <-time.After(2 * time.Minute):
			t.Fatal("the replay did not finish within 2 minutes")
		}
	}
	stopWriters()
	takeovers := e.epoch() - firstEpoch
	if res.err != nil || res.code != 0 {
		t.Fatalf("replay: exit %d, %v: %s", res.code, res.err, res.out)
	}
	var req relay.ReplayRequest
	if err := json.Unmarshal([]byte(res.out[:strings.LastIndex(res.out, "}")+1]), &req); err != nil {
		t.Fatalf("replay output %q: %v", res.out, err)
	}
	if req.Status != relay.ReplayDone || req.Done != 4000 || req.Total == nil || *req.Total != 4000 {
		t.Fatalf("replay request: %+v, want done with 4000 of 4000", req)
	}
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	a.stop()
	b.stop()

	records := e2e.ReadLog(t, e.dataDir, "orders")
	n, replayed := e2e.CheckReplay(t, records, ledger, req.ID, window)
	if midReplay == 0 {
		t.Errorf("no round of killed sessions landed while the replay ran")
	}
	t.Logf("%d live events exactly once, %d replayed once each in original order; %d of %d rounds of killed sessions landed mid-replay, %d takeovers",
		n, replayed, midReplay, rounds, takeovers)
}
