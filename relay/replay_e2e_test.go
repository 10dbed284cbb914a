package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/leakcheck"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/internal/testwait"
	"github.com/outboxrelay/relay/relay"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	testbin.Cleanup()
	leakcheck.Exit(code)
}

func runArgs(url, dataDir, httpAddr string, extra ...string) []string {
	return append([]string{"run", "--database-url", url, "--data-dir", dataDir, "--http-addr", httpAddr,
		"--kafka-addr", "", "--source", "poll", "--poll-interval", "200ms"}, extra...)
}

// runCLI runs a relay command to completion and returns its stdout (stderr
// is logged) and exit code.
func runCLI(t *testing.T, bin string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := testbin.Run(ctx, bin, nil, args...)
	if err != nil {
		t.Fatalf("relay %v: %v", args, err)
	}
	if r.Stderr != "" {
		t.Logf("relay %s: stderr: %s", args[0], strings.TrimSpace(r.Stderr))
	}
	return r.Stdout, r.Code
}

func write(t *testing.T, url string, ledger *e2e.Ledger, events int) {
	t.Helper()
	if err := e2e.Write(context.Background(), e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 2,
		Events: events, Keys: 100, PerTx: 10}, ledger); err != nil {
		t.Fatal(err)
	}
}

// liveWriters keeps writing small rounds of events until stop is called;
// stop fails the test if a writer failed.
func liveWriters(t *testing.T, url string, ledger *e2e.Ledger) (stop func()) {
	stopWriting := e2e.WriteSteadily(context.Background(), e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders",
		Writers: 2, Events: 100, Keys: 100, PerTx: 5}, ledger, 20*time.Millisecond)
	return func() {
		if err := stopWriting(); err != nil {
			t.Fatalf("live writers: %v", err)
		}
	}
}

func count(t *testing.T, conn *pgx.Conn, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReplayWindowWhileLive republishes the events of a time window while
// writers keep committing new events, and SIGKILLs the relay twice in the
// middle of the replay (once while its acknowledgements are held back, so
// the log holds replayed events whose acknowledgement never committed). The
// log must then hold every live event exactly once in per-key order, and
// exactly one replayed copy of each event of the window, marked with the
// request id, carrying its original event id, in the original order of its
// partition.
func TestReplayWindowWhileLive(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	conn := pgtest.Connect(t, url)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	args := runArgs(url, dataDir, addr, "--retain", "1h", "--batch-size", "50")
	proc := e2e.Start(t, bin, nil, args...)

	write(t, url, ledger, 1000)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	since := e2e.DBNow(t, conn)
	write(t, url, ledger, 4000)
	until := e2e.DBNow(t, conn)
	write(t, url, ledger, 1000)
	e2e.WaitDrained(t, url, "outbox", time.Minute)

	window := e2e.ArchivedWindow(t, conn, since, until, 4000)

	sinceArg, untilArg := since.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano)
	out, code := runCLI(t, bin, "replay", "--database-url", url, "--since", sinceArg, "--until", untilArg, "--dry-run", "--json")
	var dry struct{ Events int64 }
	if code != 0 || json.Unmarshal([]byte(out), &dry) != nil || dry.Events != 4000 {
		t.Fatalf("dry run: exit %d, %s; want 4000 events", code, out)
	}

	stopWriters := liveWriters(t, url, ledger)
	type result struct {
		out  string
		code int
	}
	replayDone := make(chan result, 1)
	go func() {
		out, code := runCLI(t, bin, "replay", "--database-url", url, "--since", sinceArg, "--until", untilArg, "--json", "--poll-interval", "50ms")
		replayDone <- result{out, code}
	}()

	// Two crashes while the replay runs.
	locker := pgtest.Connect(t, url)
	midReplay := 0
	for kill := 0; kill < 2; kill++ {
		deadline := time.Now().Add(30 * time.Second)
		var done, total int64
		for time.Now().Before(deadline) {
			done = count(t, conn, `SELECT coalesce(max(done), 0) FROM outbox.replay_requests WHERE status = 'running'`)
			if done > int64(kill)*800+100 {
				break
			}
			time.Sleep(10 * time.Millisecond) // condition poll: replay progress in the database
		}
		total = count(t, conn, `SELECT coalesce(max(total), 0) FROM outbox.replay_requests`)
		if done > 0 && done < total {
			midReplay++
		}
		if kill == 0 {
			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "LOCK TABLE outbox.checkpoints IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // deliberate pause: holds the checkpoint lock so the kill lands while the relay waits on it
			proc.Kill()
			tx.Rollback(ctx)
		} else {
			proc.Kill()
		}
		t.Logf("SIGKILL %d at %d of %d replayed", kill+1, done, total)
		proc = e2e.Start(t, bin, nil, args...)
	}
	var res result
	select {
	case res = <-replayDone:
	case <-time.After(90 * time.Second):
		t.Fatal("the replay did not finish in 90 s")
	}
	stopWriters()
	var req relay.ReplayRequest
	if err := json.Unmarshal([]byte(res.out), &req); err != nil || res.code != 0 {
		t.Fatalf("replay: exit %d, %s (%v)", res.code, res.out, err)
	}
	if req.Status != relay.ReplayDone || req.Done != 4000 || req.Total == nil || *req.Total != 4000 {
		t.Fatalf("replay request: %+v, want done with 4000 of 4000", req)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	proc.Stop(30 * time.Second)

	records := e2e.ReadLog(t, dataDir, "orders")
	n, replayed := e2e.CheckReplay(t, records, ledger, req.ID, window)
	t.Logf("%d live events exactly once, %d replayed once each in original order; %d of 2 kills landed mid-replay",
		n, replayed, midReplay)
}

// TestRetentionPruning archives published events with --retain and prunes
// them in batches once they are older than the retention.
func TestRetentionPruning(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	conn := pgtest.Connect(t, url)
	ledger := e2e.NewLedger()
	proc := e2e.Start(t, bin, []string{"RELAY_RETAIN=3s"}, runArgs(url, dataDir, addr, "--prune-interval", "200ms")...)
	write(t, url, ledger, 1500)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	archived := count(t, conn, "SELECT count(*) FROM outbox.events_archive")
	if archived == 0 {
		t.Fatal("nothing archived with --retain")
	}
	// Publication order is the archive's seq order within each key.
	var disorder int64 = count(t, conn, `SELECT count(*) FROM (SELECT payload, lag(payload) OVER (PARTITION BY key ORDER BY seq) AS prev FROM outbox.events_archive) AS x
WHERE (convert_from(payload, 'UTF8')::jsonb->>'seq')::int < (convert_from(prev, 'UTF8')::jsonb->>'seq')::int`)
	if disorder != 0 {
		t.Fatalf("%d archived events out of per-key order", disorder)
	}
	testwait.For(t, 20*time.Second, "the archived events older than the retention to be pruned", func() bool {
		return count(t, conn, "SELECT count(*) FROM outbox.events_archive") == 0
	})
	if got := e2e.Metric(t, addr, "relay_archive_pruned_total"); got != 1500 {
		t.Fatalf("relay_archive_pruned_total = %v, want 1500", got)
	}
	proc.Stop(30 * time.Second)
	if n := e2e.Check(t, e2e.ReadLog(t, dataDir, "orders"), ledger); n != 1500 {
		t.Fatalf("%d records, want 1500", n)
	}
}

// TestInspectionJSON checks relay topics, groups and status in JSON form,
// with the daemon stopped and running.
func TestInspectionJSON(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	conn := pgtest.Connect(t, url)
	ledger := e2e.NewLedger()
	args := runArgs(url, dataDir, addr, "--retain", "1h", "--partitions", "4")
	proc := e2e.Start(t, bin, nil, args...)
	write(t, url, ledger, 300)
	if _, err := conn.Exec(context.Background(), `INSERT INTO outbox.events (topic, key, payload) VALUES ('bad topic', 'k', 'x')`); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	proc.Stop(30 * time.Second)
	b, err := broker.Open(context.Background(), broker.Options{Dir: dataDir, JanitorInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CommitOffsets(context.Background(), "billing", []broker.OffsetCommit{{Topic: "orders", Partition: 1, Offset: 10}}); err != nil {
		t.Fatal(err)
	}
	b.Close()

	proc = e2e.Start(t, bin, nil, args...)
	e2e.WaitRole(t, proc, "leader", 30*time.Second)

	// topics, read from the files while the daemon holds them.
	out, code := runCLI(t, bin, "topics", "--data-dir", dataDir, "--json")
	var topics []struct {
		Name          string `json:"name"`
		RetentionMs   int64  `json:"retention_ms"`
		CleanupPolicy string `json:"cleanup_policy"`
		Partitions    []struct {
			Partition   int32 `json:"partition"`
			StartOffset int64 `json:"start_offset"`
			EndOffset   int64 `json:"end_offset"`
			Bytes       int64 `json:"bytes"`
		} `json:"partitions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &topics) != nil || len(topics) != 1 || topics[0].Name != "orders" {
		t.Fatalf("topics: exit %d: %s", code, out)
	}
	var records int64
	endOf := map[int32]int64{}
	for _, p := range topics[0].Partitions {
		records += p.EndOffset - p.StartOffset
		endOf[p.Partition] = p.EndOffset
		if p.EndOffset > 0 && p.Bytes == 0 {
			t.Fatalf("partition %d has records but no bytes: %s", p.Partition, out)
		}
	}
	if len(topics[0].Partitions) != 4 || records != 300 || topics[0].CleanupPolicy != "delete" || topics[0].RetentionMs != 7*24*3600*1000 {
		t.Fatalf("topics: %d partitions, %d records, want 4 and 300: %s", len(topics[0].Partitions), records, out)
	}

	out, code = runCLI(t, bin, "groups", "--data-dir", dataDir, "--kafka-addr", "", "--json")
	var groups []struct {
		Group      string `json:"group"`
		Lag        int64  `json:"lag"`
		Partitions []struct {
			Topic           string `json:"topic"`
			Partition       int32  `json:"partition"`
			Committed       int64  `json:"committed"`
			Lag             int64  `json:"lag"`
			RetentionMargin int64  `json:"retention_margin"`
		} `json:"partitions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &groups) != nil || len(groups) != 1 || len(groups[0].Partitions) != 1 {
		t.Fatalf("groups: exit %d: %s", code, out)
	}
	g := groups[0].Partitions[0]
	if groups[0].Group != "billing" || g.Topic != "orders" || g.Partition != 1 || g.Committed != 10 ||
		g.Lag != max(endOf[1]-10, 0) || g.RetentionMargin != 10 {
		t.Fatalf("groups: %s (partition 1 ends at %d)", out, endOf[1])
	}

	var st struct {
		LeaderRunning bool `json:"leader_running"`
		Daemon        *struct {
			Role  string `json:"role"`
			Ready bool   `json:"ready"`
		} `json:"daemon"`
		Checkpoints []struct {
			Source    string `json:"source"`
			Published int64  `json:"published"`
		} `json:"checkpoints"`
		Backlog struct {
			Rows int64 `json:"rows"`
		} `json:"backlog"`
		DeadLetters int64      `json:"dead_letters"`
		LastPublish *time.Time `json:"last_publish"`
		Archive     struct {
			Rows int64 `json:"rows"`
		} `json:"archive"`
		Slots   []any `json:"slots"`
		Replays []any `json:"replays"`
	}
	// The leader's readiness heartbeat is an outbox row for the moment it
	// takes to publish (one every ReadyTimeout/6): a status that caught
	// one is asked again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) { // condition poll: a status that caught a heartbeat row is asked again
		out, code = runCLI(t, bin, "status", "--database-url", url, "--http-addr", addr, "--json")
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("status: exit %d: %s", code, out)
		}
		if st.Backlog.Rows == 0 || time.Now().After(deadline) {
			break
		}
	}
	if !st.LeaderRunning || st.Daemon == nil || st.Daemon.Role != "leader" || !st.Daemon.Ready || len(st.Checkpoints) != 1 ||
		st.Checkpoints[0].Source != "poll" || st.Checkpoints[0].Published != 300 || st.Backlog.Rows != 0 ||
		st.DeadLetters != 1 || st.LastPublish == nil || st.Archive.Rows != 300 || st.Slots == nil || st.Replays == nil {
		t.Fatalf("status: %s", out)
	}
	// The human forms run too.
	for _, cmd := range [][]string{{"status", "--database-url", url, "--http-addr", addr}, {"topics", "--data-dir", dataDir}, {"groups", "--data-dir", dataDir, "--kafka-addr", ""}} {
		if out, code := runCLI(t, bin, cmd...); code != 0 || out == "" {
			t.Fatalf("%v: exit %d: %q", cmd, code, out)
		}
	}
}

// TestBacklogDrainAfterOutage stops the relay (SIGKILL) for 60 s while
// writers keep committing, checks that relay status reports the
// backlog and its age during the outage, then restarts the relay: the
// backlog drains with nothing lost or duplicated, and the drain estimate
// is exported.
func TestBacklogDrainAfterOutage(t *testing.T) {
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	ledger := e2e.NewLedger()
	args := runArgs(url, dataDir, addr)
	proc := e2e.Start(t, bin, []string{"RELAY_BATCH_SIZE=500"}, args...)
	stopWriters := liveWriters(t, url, ledger)
	time.Sleep(2 * time.Second) // deliberate pause: 2 s of publishing under load before the kill
	proc.Kill()
	time.Sleep(60 * time.Second) // simulates a 60 s outage: the backlog and its age grow while the relay is down

	out, code := runCLI(t, bin, "status", "--database-url", url, "--http-addr", addr, "--json")
	var st struct {
		LeaderRunning bool `json:"leader_running"`
		Backlog       struct {
			Rows             int64   `json:"rows"`
			OldestAgeSeconds float64 `json:"oldest_age_seconds"`
		} `json:"backlog"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("status: exit %d: %s", code, out)
	}
	if st.LeaderRunning || st.Backlog.Rows == 0 || st.Backlog.OldestAgeSeconds < 55 {
		t.Fatalf("status during the outage: %s", out)
	}
	start := time.Now()
	proc = e2e.Start(t, bin, nil, args...)
	e2e.WaitRole(t, proc, "leader", 30*time.Second)
	stopWriters()
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	t.Logf("a %d-row backlog (oldest %.0f s) drained %v after the restart", st.Backlog.Rows, st.Backlog.OldestAgeSeconds, time.Since(start).Round(time.Millisecond))
	e2e.Metric(t, addr, "relay_backlog_drain_seconds")
	proc.Stop(30 * time.Second)
	if n := e2e.Check(t, e2e.ReadLog(t, dataDir, "orders"), ledger); n != len(ledger.Committed) {
		t.Fatalf("%d records for %d committed events", n, len(ledger.Committed))
	}
}
