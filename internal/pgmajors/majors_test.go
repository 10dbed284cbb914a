package pgmajors_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

// envMajors lists the majors the tests run against, comma-separated.
const envMajors = "RELAY_TEST_PG_MAJORS"

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// majors returns the majors to test: RELAY_TEST_PG_MAJORS, or 14, 16, 17
// and 18.
func majors(t *testing.T) []int {
	t.Helper()
	list := os.Getenv(envMajors)
	if list == "" {
		return []int{14, 16, 17, 18}
	}
	var out []int
	for _, f := range strings.Split(list, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || m < 10 {
			t.Fatalf("%s=%q: %q is not a PostgreSQL major such as 17", envMajors, list, f)
		}
		out = append(out, m)
	}
	return out
}

// startMajor starts a throwaway cluster of the major's binaries, stopped
// when the test ends, and checks that it is that major.
func startMajor(t *testing.T, major int, settings map[string]string) *pgcluster.Cluster {
	t.Helper()
	dir, err := pgcluster.MajorBinDir(major)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{BinDir: dir, Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			t.Errorf("stopping PostgreSQL %d: %v", major, err)
		}
	})
	if got, err := c.Major(ctx); err != nil || got != major {
		t.Fatalf("the cluster from %s is PostgreSQL %d (%v), want %d", dir, got, err, major)
	}
	return c
}

// migratedDatabase creates a database in c, migrates it with the relay
// binary and returns its URL and the binary.
func migratedDatabase(t *testing.T, c *pgcluster.Cluster, name string) (url, bin string) {
	t.Helper()
	admin := pgtest.Connect(t, c.URL())
	if _, err := admin.Exec(context.Background(), "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	url = c.DatabaseURL(name)
	return url, e2e.MigrateURL(t, url)
}

// TestCrashLoopEveryMajor runs, against each major, the poll reader and
// then the WAL reader (large transactions streamed) under 8 writers
// committing 6,000 events over 200 keys, with the relay SIGKILLed at
// least 3 times, the first time with its acknowledgements held back. The
// log holds every committed event exactly once, each key's in commit
// order, nothing rolled back.
func TestCrashLoopEveryMajor(t *testing.T) {
	for _, major := range majors(t) {
		t.Run(fmt.Sprintf("pg%d", major), func(t *testing.T) {
			c := startMajor(t, major, nil)
			for _, source := range []string{"poll", "cdc"} {
				t.Run(source, func(t *testing.T) { crashLoop(t, c, source, major) })
			}
		})
	}
}

func crashLoop(t *testing.T, c *pgcluster.Cluster, source string, major int) {
	url, bin := migratedDatabase(t, c, "relay_"+source)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	args := []string{"run", "--source", source, "--database-url", url, "--data-dir", dataDir, "--http-addr", addr,
		"--log-level", "debug", "--kafka-addr", ""}
	load := e2e.CrashLoad(url, 6000, 200)
	if source == "poll" {
		args = append(args, "--poll-interval", "200ms")
	} else {
		args = append(args, "--slot", "relay_slot", "--heartbeat-interval", "200ms")
		// Transactions past 64 kB of changes stream while they run.
		load.PerTx = 200
		conn := pgtest.Connect(t, url)
		if _, err := conn.Exec(context.Background(), "ALTER DATABASE relay_cdc SET logical_decoding_work_mem = '64kB'"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ledger := e2e.NewLedger()
	start := func() *e2e.Proc { return e2e.Start(t, bin, nil, args...) }
	relay := start()
	writeDone := e2e.WriteAsync(ctx, load, ledger)
	relay, kills, held := e2e.KillLoop{
		Locker: pgtest.Connect(t, url), Rand: rand.New(rand.NewPCG(uint64(major), 44)), MinKills: 3,
		Every:     [2]time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		Hold:      [2]time.Duration{100 * time.Millisecond, 300 * time.Millisecond},
		Restart:   start,
		Published: e2e.LogRecords(dataDir),
	}.Run(t, ctx, relay, writeDone)
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	relay.Stop(time.Minute)
	n := e2e.CheckLog(t, dataDir, ledger)
	if source == "cdc" {
		if !strings.Contains(relay.Output(), "streaming=true") {
			t.Fatalf("the relay did not stream from PostgreSQL %d:\n%s", major, relay.Output())
		}
		// The statistics reach the view a little after the walsender
		// counted them.
		var streamed int64
		conn := pgtest.Connect(t, url)
		for deadline := time.Now().Add(20 * time.Second); streamed == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // condition poll: statistics reach the view late
			err := conn.QueryRow(context.Background(),
				"SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = 'relay_slot'").Scan(&streamed)
			if err != nil && err != pgx.ErrNoRows {
				t.Fatal(err)
			}
		}
		if streamed == 0 {
			t.Fatalf("PostgreSQL %d streamed no transaction: the test did not exercise streaming", major)
		}
		t.Logf("slot relay_slot streamed %d transactions", streamed)
	}
	t.Logf("PostgreSQL %d, %s: %d events exactly once in per-key order through %d SIGKILLs (%d with acknowledgements held back)",
		major, source, n, kills, held)
}
