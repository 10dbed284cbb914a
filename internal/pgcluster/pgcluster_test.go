package pgcluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgcluster"
)

// A request for binaries that cannot be met is an error naming what to
// install, never a fallback to other binaries or to Docker.
func TestRequestedBinariesMissing(t *testing.T) {
	for _, tc := range []struct{ env, value, want string }{
		{pgcluster.EnvMajor, "nine", "is not a PostgreSQL major version"},
		{pgcluster.EnvMajor, "9", "npm ci --prefix internal/pgcluster/testdata/majors"},
		{pgcluster.EnvBin, t.TempDir(), "holds no executable initdb and postgres"},
	} {
		t.Run(tc.env+"="+tc.value, func(t *testing.T) {
			t.Setenv(pgcluster.EnvBin, "")
			t.Setenv(pgcluster.EnvMajor, "")
			t.Setenv(tc.env, tc.value)
			c, err := pgcluster.Start(context.Background(), pgcluster.Options{})
			if err == nil {
				c.Stop(context.Background())
				t.Fatal("Start succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

// TestStandbyAndPromotion makes a standby of a PostgreSQL 14 primary (the
// pg_start_backup functions; 15 and later use pg_backup_start, which the
// failover test in internal/pgmajors exercises on 17), sees a row written
// on the primary arrive there, promotes it and writes to it.
func TestStandbyAndPromotion(t *testing.T) {
	t.Setenv(pgcluster.EnvMajor, "14")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop(context.Background())
	if m, err := primary.Major(ctx); err != nil || m != 14 {
		t.Fatalf("RELAY_TEST_PG_MAJOR=14 started PostgreSQL %d (%v)", m, err)
	}
	exec(t, primary.URL(), "CREATE TABLE t (v int)")
	standby, err := primary.StartStandby(ctx, pgcluster.StandbyOptions{Slot: "standby1"})
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop(context.Background())
	exec(t, primary.URL(), "INSERT INTO t VALUES (1)")
	conn, err := pgx.Connect(ctx, standby.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for n := 0; n != 1; time.Sleep(50 * time.Millisecond) { // condition poll: the standby replays the insert
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
	}
	var streaming bool
	if err := queryRow(t, primary.URL(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'standby1' AND slot_type = 'physical'", &streaming); !streaming {
		t.Fatalf("the standby does not stream from its physical slot: %v", err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, standby.URL(), "INSERT INTO t VALUES (2)")
}

func queryRow(t *testing.T, url, sql string, dest ...any) error {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), sql).Scan(dest...)
}

func exec(t *testing.T, url, sql string) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
