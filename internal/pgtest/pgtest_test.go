package pgtest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStartsLocalCluster proves that, without RELAY_TEST_DATABASE_URL, the
// harness runs its own server from the local binaries with logical WAL, and
// that stopping it removes the process and its files.
func TestStartsLocalCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind() != pgcluster.KindLocal {
		t.Fatalf("kind = %s, want local (binaries are installed on this machine)", c.Kind())
	}
	conn := pgtest.Connect(t, c.URL())
	var walLevel, slots, senders string
	if err := conn.QueryRow(ctx, "SELECT current_setting('wal_level'), current_setting('max_replication_slots'), current_setting('max_wal_senders')").
		Scan(&walLevel, &slots, &senders); err != nil {
		t.Fatal(err)
	}
	if walLevel != "logical" {
		t.Fatalf("wal_level = %q, want logical", walLevel)
	}
	if slots == "0" || senders == "0" {
		t.Fatalf("max_replication_slots=%s max_wal_senders=%s, want room for slots", slots, senders)
	}
	conn.Close(ctx)
	root := filepath.Dir(c.DataDir())
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
		t.Fatalf("data directory missing while running: %v", err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Fatalf("cluster directory %s still exists after Stop (err=%v)", root, err)
	}
}

// TestPackageClusterAndDatabases checks the package-wide cluster: when the
// environment names no server it is a local one, and each test's database
// is its own.
func TestPackageClusterAndDatabases(t *testing.T) {
	c := pgtest.Cluster(t)
	if os.Getenv(pgtest.EnvURL) == "" && c.Kind() != pgcluster.KindLocal {
		t.Fatalf("kind = %s without %s, want local", c.Kind(), pgtest.EnvURL)
	}
	ctx := context.Background()
	a := pgtest.Connect(t, pgtest.NewDatabase(t))
	b := pgtest.Connect(t, pgtest.NewDatabase(t))
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (x int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one test database is visible in another")
	}
}
