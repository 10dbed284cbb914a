package pgmajors_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// failoverMajor is the first major with failover slots.
const failoverMajor = 17

// TestFailoverSlotSurvivesPromotion: a PostgreSQL 17 primary with
// synchronized_standby_slots naming the physical slot of a streaming
// standby (sync_replication_slots = on); the WAL reader, connected through
// a TCP proxy, creates its slot with failover, and the standby keeps a
// synchronized copy. 8 writers commit 2,000 events over 200 keys, and once
// the standby's copy is usable 20,000 more; right after them, while the
// relay usually still publishes (the test logs how many were), the
// primary stops (a fast shutdown, which sends the standby all the WAL), the
// standby is promoted and the proxy sends new connections to it; 8 writers
// commit 10,000 more events into the new primary. The relay, never
// restarted, publishes every committed event exactly once in per-key
// order, continuing from the synchronized slot: it created its slot once
// and never read the outbox table again. /readyz has no warning while the
// standby streams, and warns once the promoted server has no standby.
func TestFailoverSlotSurvivesPromotion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	primary := startMajor(t, failoverMajor, map[string]string{"synchronized_standby_slots": "standby1"})
	dbURL, bin := migratedDatabase(t, primary, "relay_failover")
	standby, err := primary.StartStandby(ctx, pgcluster.StandbyOptions{Slot: "standby1", Database: "relay_failover",
		Settings: map[string]string{"sync_replication_slots": "on", "synchronized_standby_slots": ""}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop(context.Background()) })
	standbyURL := standby.DatabaseURL("relay_failover")

	proxy := e2e.NewProxy(t, hostPort(t, primary.URL()))
	relayURL := withHost(t, dbURL, proxy.Addr)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	relay := e2e.Start(t, bin, nil, "run", "--source", "cdc", "--database-url", relayURL, "--data-dir", dataDir,
		"--http-addr", addr, "--slot", "relay_slot", "--heartbeat-interval", "200ms", "--log-level", "debug", "--kafka-addr", "")

	ledger := e2e.NewLedger()
	if err := e2e.Write(ctx, e2e.CrashLoad(dbURL, 2_000, 200), ledger); err != nil {
		t.Fatal(err)
	}
	// The standby's copy is usable once it is no longer temporary (the
	// standby replayed past the slot's restart position).
	standbyConn := pgtest.Connect(t, standbyURL)
	waitUntil(t, ctx, "the standby's synchronized copy of relay_slot", func() bool {
		var synced, temporary, failover bool
		err := standbyConn.QueryRow(ctx, "SELECT synced, temporary, failover FROM pg_replication_slots WHERE slot_name = 'relay_slot'").
			Scan(&synced, &temporary, &failover)
		return err == nil && synced && !temporary && failover
	})
	onStandby, err := cdc.SlotFailoverState(ctx, standbyConn, "relay_slot")
	if err != nil || !onStandby.Standby || !onStandby.Synchronized() || onStandby.Warning("relay_slot") != "" {
		t.Fatalf("on the standby: %+v, %v", onStandby, err)
	}
	onPrimary, err := cdc.SlotFailoverState(ctx, pgtest.Connect(t, dbURL), "relay_slot")
	if err != nil || onPrimary.Standby || !onPrimary.Failover || !onPrimary.Synchronized() {
		t.Fatalf("on the primary: %+v, %v", onPrimary, err)
	}
	if w := readyWarnings(t, addr); len(w) != 0 {
		t.Fatalf("/readyz warns with a synchronized standby: %q", w)
	}
	logged := len(relay.Output())
	if err := e2e.Write(ctx, e2e.CrashLoad(dbURL, 20_000, 200), ledger); err != nil {
		t.Fatal(err)
	}
	published := e2e.LogRecords(dataDir)()

	// A fast shutdown sends the standby all the WAL before the primary
	// exits; the logical walsender never sent the relay more than the
	// standby confirmed (synchronized_standby_slots).
	if err := primary.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	proxy.Retarget(hostPort(t, standby.URL()))
	proxy.Cut()
	if err := e2e.Write(ctx, e2e.CrashLoad(standbyURL, 10_000, 200), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, standbyURL, "outbox", 2*time.Minute)
	waitUntil(t, ctx, "a /readyz warning that the promoted server has no standby", func() bool {
		w := readyWarnings(t, addr)
		return len(w) == 1 && strings.Contains(w[0], "synchronized_standby_slots is empty")
	})
	relay.Stop(time.Minute)
	out := relay.Output()
	if !strings.Contains(out[:logged], "failover=true") {
		t.Fatal("the relay did not create its slot with failover")
	}
	// Before the promotion the relay created its slot and read the rows
	// written before the creation from the table; after it, neither.
	after := out[logged:]
	for _, fallback := range []string{"creat", "from the table", "REPLICATION SLOT"} {
		if strings.Contains(after, fallback) {
			t.Fatalf("after the promotion the relay logged %q: it did not continue from the synchronized slot:\n%s", fallback, grepLines(after, fallback))
		}
	}
	n := e2e.CheckLog(t, dataDir, ledger)
	t.Logf("%d events exactly once in per-key order across a promotion (%d records of %d committed were in the log when the primary stopped), from the synchronized slot, without a table read",
		n, published, 22_000)
}

// readyWarnings reads the warnings of the relay's /readyz.
func readyWarnings(t *testing.T, addr string) []string {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Warnings []string `json:"warnings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Warnings
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func hostPort(t *testing.T, pgURL string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Host + ":" + strconv.Itoa(int(cfg.Port))
}

func withHost(t *testing.T, pgURL, hostPort string) string {
	t.Helper()
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostPort
	return u.String()
}

// grepLines returns the lines of out that contain s.
func grepLines(out, s string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
