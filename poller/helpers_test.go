package poller_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/migrations"
)

// The package's second cluster, with track_commit_timestamp = on (a
// server-start setting), started by the first test that needs it and
// stopped by TestMain.
var commitTS struct {
	once sync.Once
	c    *pgcluster.Cluster
	err  error
	seq  atomic.Int64
}

// commitTSDatabase creates an empty database in the commit-timestamp
// cluster and returns its URL; it is dropped when the test ends.
func commitTSDatabase(t *testing.T) string {
	t.Helper()
	commitTS.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		commitTS.c, commitTS.err = pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"track_commit_timestamp": "on"}})
	})
	if commitTS.err != nil {
		t.Fatalf("starting a cluster with track_commit_timestamp = on: %v", commitTS.err)
	}
	ctx := context.Background()
	name := fmt.Sprintf("committs_%d", commitTS.seq.Add(1))
	admin, err := pgx.Connect(ctx, commitTS.c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(ctx, commitTS.c.URL())
		if err != nil {
			return
		}
		defer admin.Close(ctx)
		admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	})
	return commitTS.c.DatabaseURL(name)
}

// modeDatabase returns a migrated database, and a connection to it, in
// the cluster of mode: "row-id" (track_commit_timestamp off) or
// "commit-timestamp" (on).
func modeDatabase(t *testing.T, mode string) (string, *pgx.Conn) {
	t.Helper()
	var url string
	if mode == "row-id" {
		url = pgtest.NewDatabase(t)
	} else {
		url = commitTSDatabase(t)
	}
	conn := pgtest.Connect(t, url)
	pgtest.Migrate(t, conn, migrations.DefaultSchema)
	return url, conn
}

// eachMode runs test as a subtest in each mode of modeDatabase, on a
// database of that mode, with a context that ends after timeout.
func eachMode(t *testing.T, timeout time.Duration, test func(t *testing.T, ctx context.Context, mode, url string, conn *pgx.Conn)) {
	for _, mode := range []string{"row-id", "commit-timestamp"} {
		t.Run(mode, func(t *testing.T) {
			url, conn := modeDatabase(t, mode)
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			test(t, ctx, mode, url, conn)
		})
	}
}

func stopCommitTSCluster() {
	if commitTS.c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		commitTS.c.Stop(ctx)
	}
}
