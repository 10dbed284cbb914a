// Package pgtest gives each test package one real PostgreSQL cluster and each
// test a fresh database in it.
//
// The cluster comes from RELAY_TEST_DATABASE_URL when that is set (a
// superuser URL to a server with wal_level=logical); else pgcluster.Start
// makes a throwaway one from the local binaries (those of
// RELAY_TEST_PG_BIN or of the major RELAY_TEST_PG_MAJOR names, when set:
// see docs/postgres.md) or, failing that, in a container. When none of these works the package fails loudly: tests never
// skip because PostgreSQL is missing.
//
// Use it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/migrations"
)

// EnvURL names the variable that points the tests at an existing server.
const EnvURL = "RELAY_TEST_DATABASE_URL"

var (
	cluster *pgcluster.Cluster
	dbSeq   atomic.Int64
	// commitTS is the package's second cluster, with
	// track_commit_timestamp = on (a server-start setting), started by
	// the first test that asks for it and stopped by Run.
	commitTS struct {
		once sync.Once
		c    *pgcluster.Cluster
		err  error
	}
)

// Main starts the package's cluster, runs the tests, stops the cluster and
// removes its files, calls each of after (testbin.Cleanup, say), then exits
// with the tests' status.
func Main(m *testing.M, after ...func()) {
	code := Run(m)
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

// Run is Main without the exit, for a TestMain with more to clean up.
func Run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	c, err := Open(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: cannot get a PostgreSQL server for the tests: %v\n", err)
		return 1
	}
	cluster = c
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(stopCtx); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stopping the cluster: %v\n", err)
		}
		if commitTS.c != nil {
			if err := commitTS.c.Stop(stopCtx); err != nil {
				fmt.Fprintf(os.Stderr, "pgtest: stopping the commit-timestamp cluster: %v\n", err)
			}
		}
	}()
	return m.Run()
}

// Open returns the server named by RELAY_TEST_DATABASE_URL, or starts a
// throwaway one.
func Open(ctx context.Context) (*pgcluster.Cluster, error) {
	if url := os.Getenv(EnvURL); url != "" {
		return pgcluster.External(url), nil
	}
	return pgcluster.Start(ctx, pgcluster.Options{})
}

// Cluster returns the package's cluster. It fails the test when Main did not
// start one.
func Cluster(t testing.TB) *pgcluster.Cluster {
	t.Helper()
	if cluster == nil {
		t.Fatal("pgtest: no cluster; call pgtest.Main(m) from TestMain")
	}
	return cluster
}

// NewDatabase creates an empty database for the calling test and returns a
// superuser URL to it. The database and any replication slots in it are
// dropped when the test ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabaseIn(t, Cluster(t))
}

// CommitTimestampDatabase is NewDatabase in a second cluster of the
// package, started with track_commit_timestamp = on by the first test
// that asks for it (a throwaway one from the local binaries, also when
// RELAY_TEST_DATABASE_URL names a server) and stopped by Main.
func CommitTimestampDatabase(t testing.TB) string {
	t.Helper()
	commitTS.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		commitTS.c, commitTS.err = pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	})
	if commitTS.err != nil {
		t.Fatalf("pgtest: starting a cluster with track_commit_timestamp = on: %v", commitTS.err)
	}
	return newDatabaseIn(t, commitTS.c)
}

func newDatabaseIn(t testing.TB, c *pgcluster.Cluster) string {
	t.Helper()
	name := fmt.Sprintf("relaytest_%d_%d", os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatalf("pgtest: connecting to the cluster: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	t.Cleanup(func() { dropDatabase(t, c.URL(), name) })
	return c.DatabaseURL(name)
}

func dropDatabase(t testing.TB, adminURL, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Logf("pgtest: dropping %s: %v", name, err)
		return
	}
	defer admin.Close(ctx)
	// Slots outlive connections and block DROP DATABASE; walsenders hold
	// slots active, so end them first.
	admin.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE database = $1 AND active_pid IS NOT NULL`, name)
	admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE database = $1 AND NOT active`, name)
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		t.Logf("pgtest: dropping %s: %v", name, err)
	}
}

// Migrate applies Relay's migrations for schema through conn.
func Migrate(t testing.TB, conn *pgx.Conn, schema string) {
	t.Helper()
	m, err := migrations.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(context.Background(), conn, false); err != nil {
		t.Fatalf("pgtest: migrating: %v", err)
	}
}

// Connect opens a connection closed when the test ends.
func Connect(t testing.TB, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("pgtest: connecting: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// MigratedDatabase creates a database for the calling test (NewDatabase),
// applies Relay's migrations for schema there, and returns its URL and a
// connection to it, closed when the test ends.
func MigratedDatabase(t testing.TB, schema string) (string, *pgx.Conn) {
	t.Helper()
	url := NewDatabase(t)
	conn := Connect(t, url)
	Migrate(t, conn, schema)
	return url, conn
}
