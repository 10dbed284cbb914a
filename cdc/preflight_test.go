package cdc_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/migrations"
	"github.com/outboxrelay/relay/relay"
)

// startErr starts a source with cfg and returns Start's error.
func startErr(t *testing.T, cfg cdc.Config) error {
	t.Helper()
	src, err := cdc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = src.Start(ctx, relay.Position{})
	src.Close(ctx)
	if err == nil {
		t.Fatal("Start succeeded")
	}
	return err
}

func checkErr(t *testing.T, err, sentinel error, fragments ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q is not %q", err, sentinel)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Fatalf("error %q does not say %q", err, f)
		}
	}
	t.Logf("message: %v", err)
}

func TestPreflightRoleWithoutReplication(t *testing.T) {
	t.Parallel()
	f := setup(t)
	role := "norepl_" + f.conn.Config().Database
	f.exec(t, "CREATE ROLE "+role+" LOGIN NOREPLICATION")
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	t.Cleanup(func() {
		f.conn.Exec(context.Background(), "DROP OWNED BY "+role)
		f.conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	cfg := f.cfg
	cfg.DatabaseURL = u.String()
	checkErr(t, startErr(t, cfg), cdc.ErrReplicationPrivilege,
		"cdc: the role lacks the REPLICATION attribute: role \""+role+"\" may not stream changes; grant it with ALTER ROLE \""+role+"\" REPLICATION")
}

func TestPreflightPublicationNotCoveringTheOutbox(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.exec(t, "CREATE TABLE other (x int)")
	f.exec(t, "CREATE PUBLICATION elsewhere FOR TABLE other")
	f.exec(t, "CREATE PUBLICATION updates_only FOR TABLE outbox.events WITH (publish = 'update')")
	cfg := f.cfg
	cfg.PublicationName = "elsewhere"
	checkErr(t, startErr(t, cfg), cdc.ErrPublication,
		`publication "elsewhere" exists but does not publish the inserts of "outbox"."events"`, "ALTER PUBLICATION elsewhere ADD TABLE")
	cfg.PublicationName = "updates_only"
	checkErr(t, startErr(t, cfg), cdc.ErrPublication, `publication "updates_only" exists but does not publish the inserts`,
		"run ALTER PUBLICATION updates_only SET (publish = 'insert'), or drop")
}

func TestPreflightSlotActiveElsewhere(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.start(t, relay.Position{})
	var pid int32
	waitFor(t, 10*time.Second, "the first source to stream", func() bool {
		f.conn.QueryRow(context.Background(), "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1", f.cfg.SlotName).Scan(&pid)
		return pid != 0
	})
	began := time.Now()
	err := startErr(t, f.cfg)
	if took := time.Since(began); took > 5*time.Second {
		t.Fatalf("Start took %v to report the active slot", took)
	}
	var active *cdc.SlotActiveError
	if !errors.As(err, &active) || active.PID != pid {
		t.Fatalf("error %v is not a SlotActiveError for pid %d", err, pid)
	}
	checkErr(t, err, cdc.ErrSlotActive, "cdc: the replication slot is active in another process", "waits as a standby")
}

// migratedCluster starts a cluster with settings and migrates its
// postgres database.
func migratedCluster(t *testing.T, settings map[string]string) (*pgcluster.Cluster, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: settings})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	pgtest.Migrate(t, conn, migrations.DefaultSchema)
	return c, conn
}

func TestPreflightOwnClusters(t *testing.T) {
	t.Parallel()
	t.Run("wal_level", func(t *testing.T) {
		t.Parallel()
		c, _ := migratedCluster(t, map[string]string{"wal_level": "replica"})
		checkErr(t, startErr(t, cdc.Config{DatabaseURL: c.URL(), Logger: testLogger(t)}), cdc.ErrWALLevel,
			"cdc: wal_level must be logical: the server runs with wal_level = replica; set wal_level = logical")
	})
	t.Run("no free slot", func(t *testing.T) {
		t.Parallel()
		c, conn := migratedCluster(t, map[string]string{"max_replication_slots": "1"})
		if _, err := conn.Exec(context.Background(), "SELECT pg_create_logical_replication_slot('taken', 'pgoutput')"); err != nil {
			t.Fatal(err)
		}
		checkErr(t, startErr(t, cdc.Config{DatabaseURL: c.URL(), Logger: testLogger(t)}), cdc.ErrNoFreeSlot,
			"cdc: no free replication slot: 1 of max_replication_slots = 1 are in use")
	})
}
