package migrations_test

import (
	"context"
	"errors"
	"io/fs"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup gives a test a connection to a new database and the migrator it
// runs there (see migrator).
func setup(t *testing.T, fsys fs.FS, schema string) (context.Context, *pgx.Conn, *migrations.Migrator) {
	t.Helper()
	conn := pgtest.Connect(t, pgtest.NewDatabase(t))
	return context.Background(), conn, migrator(t, fsys, schema)
}

// migrator is what every test builds first: the embedded set (fsys nil)
// or a set of its own, for schema; a set that does not load fails the
// test.
func migrator(t *testing.T, fsys fs.FS, schema string) *migrations.Migrator {
	t.Helper()
	var (
		m   *migrations.Migrator
		err error
	)
	if fsys == nil {
		m, err = migrations.New(schema)
	} else {
		m, err = migrations.Load(fsys, schema)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// mustUp applies every pending migration and fails the test on error.
func mustUp(t *testing.T, m *migrations.Migrator, conn *pgx.Conn) {
	t.Helper()
	if _, err := m.Up(context.Background(), conn, false); err != nil {
		t.Fatal(err)
	}
}

// status reads m's status and fails the test on error.
func status(t *testing.T, m *migrations.Migrator, conn *pgx.Conn) migrations.Status {
	t.Helper()
	st, err := m.Status(context.Background(), conn)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func tableExists(t *testing.T, conn *pgx.Conn, name string) bool {
	t.Helper()
	var ok bool
	if err := conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestEmbeddedSetIsValid(t *testing.T) {
	m := migrator(t, nil, migrations.DefaultSchema)
	if m.Latest() < 1 {
		t.Fatal("no embedded migrations")
	}
}

func TestUpStatusDownUp(t *testing.T) {
	t.Parallel()
	ctx, conn, m := setup(t, nil, "outbox")

	st := status(t, m, conn)
	if st.Current != 0 || len(st.Pending()) != m.Latest() {
		t.Fatalf("fresh database: current=%d pending=%v, want 0 and all %d", st.Current, st.Pending(), m.Latest())
	}
	if tableExists(t, conn, "outbox.schema_migrations") {
		t.Fatal("Status created the version table; it must be read-only")
	}
	if err := m.Check(ctx, conn); !errors.Is(err, migrations.ErrPending) {
		t.Fatalf("Check on a fresh database = %v, want ErrPending", err)
	}

	steps, err := m.Up(ctx, conn, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != m.Latest() {
		t.Fatalf("Up applied %d steps, want %d", len(steps), m.Latest())
	}
	if err := m.Check(ctx, conn); err != nil {
		t.Fatalf("Check after Up: %v", err)
	}
	st = status(t, m, conn)
	if st.Current != m.Latest() || len(st.Pending()) != 0 {
		t.Fatalf("after Up: current=%d pending=%v", st.Current, st.Pending())
	}
	for _, v := range st.Versions {
		if !v.Applied || v.AppliedAt.IsZero() {
			t.Fatalf("version %d not recorded as applied: %+v", v.Version, v)
		}
	}
	if _, err := conn.Exec(ctx, "INSERT INTO outbox.events (topic, key, payload) VALUES ('t', 'k', 'v')"); err != nil {
		t.Fatalf("the write contract's INSERT fails after Up: %v", err)
	}

	again, err := m.Up(ctx, conn, false)
	if err != nil || len(again) != 0 {
		t.Fatalf("second Up = %v, %v; want nothing to do", again, err)
	}

	down, err := m.Down(ctx, conn, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(down) != m.Latest() || down[0].Version != m.Latest() {
		t.Fatalf("Down to 0 ran %+v, want every version newest first", down)
	}
	if tableExists(t, conn, "outbox.events") {
		t.Fatal("outbox.events still exists after migrating down to 0")
	}
	st = status(t, m, conn)
	if st.Current != 0 {
		t.Fatalf("after Down: current=%d, want 0", st.Current)
	}

	if _, err := m.Up(ctx, conn, false); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
	if !tableExists(t, conn, "outbox.events") {
		t.Fatal("outbox.events missing after Up again")
	}
}

// threeStep is a small set for testing step-wise down and failures.
func threeStep(third string) fstest.MapFS {
	return fstest.MapFS{
		"001_a.up.sql":   {Data: []byte("CREATE TABLE {{schema}}.a (x int);")},
		"001_a.down.sql": {Data: []byte("DROP TABLE {{schema}}.a;")},
		"002_b.up.sql":   {Data: []byte("CREATE TABLE {{schema}}.b (x int);")},
		"002_b.down.sql": {Data: []byte("DROP TABLE {{schema}}.b;")},
		"003_c.up.sql":   {Data: []byte(third)},
		"003_c.down.sql": {Data: []byte("DROP TABLE {{schema}}.c;")},
	}
}

func TestDownStepwiseAndTo(t *testing.T) {
	t.Parallel()
	ctx, conn, m := setup(t, threeStep("CREATE TABLE {{schema}}.c (x int);"), "custom_schema")
	mustUp(t, m, conn)
	steps, err := m.Down(ctx, conn, -1, false)
	if err != nil || len(steps) != 1 || steps[0].Version != 3 {
		t.Fatalf("one-step Down = %+v, %v; want version 3 only", steps, err)
	}
	if tableExists(t, conn, "custom_schema.c") || !tableExists(t, conn, "custom_schema.b") {
		t.Fatal("one-step Down removed the wrong tables")
	}
	steps, err = m.Down(ctx, conn, 1, false)
	if err != nil || len(steps) != 1 || steps[0].Version != 2 {
		t.Fatalf("Down --to 1 = %+v, %v; want version 2 only", steps, err)
	}
	if !tableExists(t, conn, "custom_schema.a") || tableExists(t, conn, "custom_schema.b") {
		t.Fatal("Down --to 1 left the wrong tables")
	}
	if _, err := m.Down(ctx, conn, 4, false); err == nil {
		t.Fatal("Down --to a version above the latest succeeded")
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	ctx, conn, m := setup(t, nil, "outbox")
	steps, err := m.Up(ctx, conn, true)
	if err != nil || len(steps) != m.Latest() || steps[0].SQL == "" {
		t.Fatalf("dry-run Up = %d steps, %v", len(steps), err)
	}
	if tableExists(t, conn, "outbox.events") || tableExists(t, conn, "outbox.schema_migrations") {
		t.Fatal("dry run created tables")
	}
}

func TestFailedMigrationLeavesPreviousVersion(t *testing.T) {
	t.Parallel()
	ctx, conn, m := setup(t, threeStep("CREATE TABLE {{schema}}.c (x int); SELECT no_such_function();"), "s")
	if _, err := m.Up(ctx, conn, false); err == nil {
		t.Fatal("Up with a broken migration succeeded")
	}
	st := status(t, m, conn)
	if st.Current != 2 {
		t.Fatalf("current = %d after a failed third migration, want 2", st.Current)
	}
	if tableExists(t, conn, "s.c") {
		t.Fatal("the failed migration's first statement was kept: it did not run in one transaction")
	}
}

func TestConcurrentUpAppliesEachVersionOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	m := migrator(t, nil, "outbox")
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied = map[int]int{}
		errs    []error
	)
	for i := 0; i < 4; i++ {
		conn := pgtest.Connect(t, url)
		wg.Add(1)
		go func() {
			defer wg.Done()
			steps, err := m.Up(ctx, conn, false)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, s := range steps {
				applied[s.Version]++
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Up failed: %v", errs)
	}
	for v := 1; v <= m.Latest(); v++ {
		if applied[v] != 1 {
			t.Fatalf("version %d applied %d times across 4 migrators, want once", v, applied[v])
		}
	}
	conn := pgtest.Connect(t, url)
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox.schema_migrations").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != m.Latest() {
		t.Fatalf("version table has %d rows, want %d", rows, m.Latest())
	}
}

func TestInvalidSetsAreRefused(t *testing.T) {
	up := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	cases := map[string]fstest.MapFS{
		"gap": {
			"001_a.up.sql": up("SELECT 1"), "001_a.down.sql": up("SELECT 1"),
			"003_c.up.sql": up("SELECT 1"), "003_c.down.sql": up("SELECT 1"),
		},
		"duplicate version": {
			"001_a.up.sql": up("SELECT 1"), "001_a.down.sql": up("SELECT 1"),
			"001_b.up.sql": up("SELECT 1"), "001_b.down.sql": up("SELECT 1"),
		},
		"duplicate file": {
			"001_a.up.sql": up("SELECT 1"), "01_a.up.sql": up("SELECT 1"), "001_a.down.sql": up("SELECT 1"),
		},
		"missing down": {
			"001_a.up.sql": up("SELECT 1"),
		},
		"starts at 2": {
			"002_a.up.sql": up("SELECT 1"), "002_a.down.sql": up("SELECT 1"),
		},
		"bad name": {
			"001_a.up.sql": up("SELECT 1"), "001_a.down.sql": up("SELECT 1"), "notes.sql": up("SELECT 1"),
		},
	}
	for name, fsys := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := migrations.Load(fsys, "outbox")
			if !errors.Is(err, migrations.ErrInvalidSet) {
				t.Fatalf("Load = %v, want ErrInvalidSet", err)
			}
		})
	}
}

func TestInvalidSchemaIsRefused(t *testing.T) {
	for _, name := range []string{"", "Outbox", "1abc", "out-box", `x"; DROP TABLE y; --`} {
		if _, err := migrations.New(name); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("New(%q) = %v, want ErrInvalidSchema", name, err)
		}
	}
}

func TestNewerDatabaseIsRefused(t *testing.T) {
	t.Parallel()
	ctx, conn, m := setup(t, nil, "outbox")
	mustUp(t, m, conn)
	if _, err := conn.Exec(ctx, "INSERT INTO outbox.schema_migrations (version, name) VALUES ($1, 'from_the_future')", m.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx, conn, false); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Fatalf("Up = %v, want ErrSchemaTooNew", err)
	}
	if _, err := m.Down(ctx, conn, 0, false); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Fatalf("Down = %v, want ErrSchemaTooNew", err)
	}
	if err := m.Check(ctx, conn); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Fatalf("Check = %v, want ErrSchemaTooNew", err)
	}
	st := status(t, m, conn)
	last := st.Versions[len(st.Versions)-1]
	if !last.Unknown || last.Version != m.Latest()+1 {
		t.Fatalf("Status does not show the unknown version: %+v", st.Versions)
	}
	if !tableExists(t, conn, "outbox.events") {
		t.Fatal("a refused Down still dropped the outbox")
	}
}

// TestCompatibleRange: a relay whose latest migration is 2 runs on a
// database at 3 when migration 3 declares compatible-from 2 (and 1), and is
// refused when 3 declares nothing; a declaration beyond the range it may
// name makes the set invalid; rows recorded before the column existed
// count as strict.
func TestCompatibleRange(t *testing.T) {
	t.Parallel()
	older := threeStep("")
	delete(older, "003_c.up.sql")
	delete(older, "003_c.down.sql")
	for _, tc := range []struct {
		name, third string
		compatible  bool
	}{
		{"declared 2", "-- An expand step.\n-- compatible-from: 2\nCREATE TABLE {{schema}}.c (x int);", true},
		{"declared 1", "-- compatible-from: 1\nCREATE TABLE {{schema}}.c (x int);", true},
		{"undeclared", "CREATE TABLE {{schema}}.c (x int);", false},
		{"declared 3", "-- compatible-from: 3\nCREATE TABLE {{schema}}.c (x int);", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, conn, newer := setup(t, threeStep(tc.third), "outbox")
			old := migrator(t, older, "outbox")
			mustUp(t, old, conn)
			mustUp(t, newer, conn)
			err := old.Check(ctx, conn)
			if tc.compatible && err != nil {
				t.Fatalf("the older relay's Check = %v, want nil", err)
			}
			if !tc.compatible && !errors.Is(err, migrations.ErrSchemaTooNew) {
				t.Fatalf("the older relay's Check = %v, want ErrSchemaTooNew", err)
			}
			// Only the newer relay changes its schema.
			if _, err := old.Up(ctx, conn, false); !errors.Is(err, migrations.ErrSchemaTooNew) {
				t.Fatalf("the older relay's Up = %v, want ErrSchemaTooNew", err)
			}
			if err := newer.Check(ctx, conn); err != nil {
				t.Fatalf("the newer relay's Check = %v", err)
			}
		})
	}
	t.Run("out of range", func(t *testing.T) {
		for _, decl := range []string{"-- compatible-from: 4", "-- compatible-from: 0", "-- compatible-from: x", "-- compatible-from: 1\n-- compatible-from: 2"} {
			if _, err := migrations.Load(threeStep(decl+"\nSELECT 1"), "outbox"); !errors.Is(err, migrations.ErrInvalidSet) {
				t.Errorf("Load with %q = %v, want ErrInvalidSet", decl, err)
			}
		}
	})
	t.Run("recorded without the column", func(t *testing.T) {
		ctx, conn, newer := setup(t, threeStep("-- compatible-from: 2\nCREATE TABLE {{schema}}.c (x int);"), "outbox")
		mustUp(t, newer, conn)
		// As a relay older than the column left it: the column gone.
		if _, err := conn.Exec(ctx, "ALTER TABLE outbox.schema_migrations DROP COLUMN compatible_from"); err != nil {
			t.Fatal(err)
		}
		old := migrator(t, older, "outbox")
		if err := old.Check(ctx, conn); !errors.Is(err, migrations.ErrSchemaTooNew) {
			t.Fatalf("Check without recorded bounds = %v, want ErrSchemaTooNew", err)
		}
		// The next Up of the newer relay adds the column back, NULL for
		// the rows it did not record: still strict.
		mustUp(t, newer, conn)
		if got := status(t, newer, conn).Requires(); got != 3 {
			t.Fatalf("Requires = %d, want 3", got)
		}
	})
}

// TestEmbeddedCompatibility: every migration after the latest release
// (release/RELEASES, its migrations read from git history) keeps that
// release's relays running, as docs/upgrading.md promises: it declares
// compatible-from at most the release's latest version. A contract step
// (dropping what an older relay uses) belongs in the release after the one
// that stopped using it, and then declares that release's latest.
func TestEmbeddedCompatibility(t *testing.T) {
	releases, err := testbin.Releases()
	if err != nil {
		t.Fatal(err)
	}
	rel := releases[len(releases)-1]
	out, err := exec.Command("git", "ls-tree", "--name-only", rel.Commit, "./").CombinedOutput()
	if err != nil {
		t.Fatalf("listing the migrations of %s (%s): %v: %s; the clone needs its history (git fetch --unshallow)", rel.Version, rel.Commit, err, out)
	}
	released := 0
	for _, name := range strings.Fields(string(out)) {
		if strings.HasSuffix(name, ".up.sql") {
			released++
		}
	}
	if released == 0 {
		t.Fatalf("%s has no migrations in git", rel.Version)
	}
	m := migrator(t, nil, migrations.DefaultSchema)
	if m.Latest() < released {
		t.Fatalf("this relay knows %d migrations, %s had %d", m.Latest(), rel.Version, released)
	}
	for _, mig := range m.Migrations() {
		if mig.Version > released && mig.CompatibleFrom > released {
			t.Errorf("migration %03d_%s declares compatible-from %d: relays of %s (latest %d) would refuse the schema during a rolling upgrade; see docs/upgrading.md",
				mig.Version, mig.Name, mig.CompatibleFrom, rel.Version, released)
		}
	}
	t.Logf("%s ended at migration %d; %d migrations since", rel.Version, released, m.Latest()-released)
}
