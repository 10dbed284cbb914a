package relay_test

import (
	"context"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/relay"
)

// TestStartupSurvivesALostConnection: the relay's first question to the
// database, whether the schema is at its version, loses its connection
// (the server restarting, as in a CI run of the WAL reader's restart
// test, where the relay exited with "reading migration versions:
// unexpected EOF"). The relay asks again and goes on to lead and publish;
// it does not exit. The check is held behind an ACCESS EXCLUSIVE lock on
// the version table and its session terminated while it waits.
func TestStartupSurvivesALostConnection(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := pgtest.Connect(t, url)
	locker := pgtest.Connect(t, url)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE outbox.schema_migrations IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}

	p := e2e.Start(t, bin, nil, runArgs(url, e2e.DataDir(t), e2e.FreeAddr(t))...)
	terminated := 0
	for deadline := time.Now().Add(time.Minute); terminated == 0; time.Sleep(20 * time.Millisecond) { // condition poll: the lock wait is in another process
		if time.Now().After(deadline) {
			t.Fatalf("the relay's schema check never waited on the lock:\n%s", p.Output())
		}
		if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, relay.ApplicationName).Scan(&terminated); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	e2e.WaitRole(t, p, string(relay.RoleLeader), time.Minute)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	if out := p.Output(); !strings.Contains(out, "checking the schema version failed; trying again") {
		t.Fatalf("the relay's log does not say it tried again:\n%s", out)
	}
}

// TestStartupRefusedExits: an answer of the server that asking again will
// not change ends `relay run` at start-up with that answer, instead of a
// retry loop that hides it: no such database (3D000), and a role that may
// not read the version table (42501). A connection refused is retried
// (TestStartupSurvivesALostConnection covers one lost).
func TestStartupRefusedExits(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	admin := pgtest.Connect(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := admin.Exec(ctx, `CREATE ROLE relay_nopriv LOGIN; GRANT USAGE ON SCHEMA outbox TO relay_nopriv`); err != nil {
		t.Fatal(err)
	}
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	noDB, noPriv := *u, *u
	noDB.Path = "/relay_no_such_database"
	noPriv.User = neturl.User("relay_nopriv")
	for _, c := range []struct{ name, url, want string }{
		{"no such database", noDB.String(), "3D000"},
		{"no privilege", noPriv.String(), "42501"},
	} {
		p := e2e.Start(t, bin, nil, runArgs(c.url, e2e.DataDir(t), e2e.FreeAddr(t))...)
		if code := p.Wait(30 * time.Second); code <= 0 {
			t.Errorf("%s: relay run exit code %d (-1: still running after 30 s), want an error:\n%s", c.name, code, p.Output())
		}
		out := p.Output()
		if !strings.Contains(out, c.want) {
			t.Errorf("%s: the relay's output does not name %s:\n%s", c.name, c.want, out)
		}
		if strings.Contains(out, "trying again") {
			t.Errorf("%s: the relay retried an answer that will not change:\n%s", c.name, out)
		}
	}
}

// TestStartupWaitsForConnections: a relay started while its database
// refuses connections (ALLOW_CONNECTIONS false, SQLSTATE 55000, as during
// maintenance) keeps asking and leads once they are allowed again.
func TestStartupWaitsForConnections(t *testing.T) {
	t.Parallel()
	url, bin := e2e.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	other := *u
	other.Path = "/postgres"
	admin := pgtest.Connect(t, other.String())
	if _, err := pgtest.Connect(t, url).Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', 'k', '{}')`); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	p := e2e.Start(t, bin, nil, runArgs(url, e2e.DataDir(t), e2e.FreeAddr(t))...)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(p.Output(), "55000"); time.Sleep(50 * time.Millisecond) { // condition poll: the relay's output is another process's
		if time.Now().After(deadline) || p.Exited() {
			t.Fatalf("the relay did not report the refused connection and wait:\n%s", p.Output())
		}
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` ALLOW_CONNECTIONS true`); err != nil {
		t.Fatal(err)
	}
	e2e.WaitRole(t, p, string(relay.RoleLeader), time.Minute)
	e2e.WaitDrained(t, url, "outbox", time.Minute)
}
