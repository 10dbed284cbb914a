// Package migrations holds Relay's SQL migrations and applies them.
//
// Each migration is a pair of files, NNN_name.up.sql and NNN_name.down.sql,
// embedded in the binary. Versions count up from 1 without gaps; a gap, a
// duplicate or a half pair is refused when the set is loaded. The SQL names
// the schema as {{schema}}, so one database can hold several outboxes.
//
// Applied versions are recorded in <schema>.schema_migrations. Each
// migration runs in its own transaction together with its version row, so a
// failure leaves the database at the previous version. A Postgres advisory
// lock, keyed by the schema, serialises migrators: of several relays started
// at once, one migrates and the others find the work done.
//
// # Compatibility range
//
// A rolling upgrade runs release N's `relay migrate up` while relays of
// release N-1 still run, so a migration says which older relays may run on
// a schema that has it: an up file may declare, in a line of its own,
//
//	-- compatible-from: K
//
// meaning that a relay whose latest migration is K or later works with
// this migration applied (it only adds what older relays ignore: the
// "expand" half of expand-then-contract, docs/upgrading.md). Without the
// line K is the migration's own version: only relays that know it may run.
// The version table records K for each applied migration
// (schema_migrations.compatible_from), so a relay reads the range of
// migrations it does not know from the database. Check accepts a database
// ahead of the binary when every migration beyond the binary's latest
// allows it, and refuses it otherwise with ErrSchemaTooNew instead of
// guessing. Migrations recorded by a relay older than the column (NULL)
// count as strict. Up and Down refuse any database ahead of the binary:
// only the newer relay may change its schema.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed *.sql
var embedded embed.FS

// DefaultSchema is the schema Relay uses unless told otherwise.
const DefaultSchema = "outbox"

var (
	// ErrSchemaTooNew means the database was migrated by a newer relay.
	ErrSchemaTooNew = errors.New("database schema is newer than this relay")
	// ErrPending means migrations remain to be applied.
	ErrPending = errors.New("database schema has pending migrations")
	// ErrInvalidSet means the migration files themselves are inconsistent.
	ErrInvalidSet = errors.New("invalid migration set")
	// ErrInvalidSchema means the schema name is not a plain identifier.
	ErrInvalidSchema = errors.New("invalid schema name")
)

// Migration is one numbered step with its forward and backward SQL.
type Migration struct {
	Version int
	Name    string
	Up      string
	Down    string
	// CompatibleFrom is the oldest latest-version a relay may have to run
	// with this migration applied: the up file's "-- compatible-from: K"
	// line, or Version without one.
	CompatibleFrom int
}

// compatPattern finds an up file's compatibility declaration.
var compatPattern = regexp.MustCompile(`(?m)^-- compatible-from: *(\S*) *$`)

// compatibleFrom reads the declaration of migration version from its up SQL.
func compatibleFrom(version int, up string) (int, error) {
	found := compatPattern.FindAllStringSubmatch(up, -1)
	switch len(found) {
	case 0:
		return version, nil
	case 1:
	default:
		return 0, fmt.Errorf("%w: version %d declares compatible-from %d times", ErrInvalidSet, version, len(found))
	}
	k, err := strconv.Atoi(found[0][1])
	if err != nil || k < 1 || k > version {
		return 0, fmt.Errorf("%w: version %d: compatible-from %q must be a version from 1 to %d", ErrInvalidSet, version, found[0][1], version)
	}
	return k, nil
}

// Migrator applies a loaded migration set to one schema.
type Migrator struct {
	schema     string
	migrations []Migration
}

var schemaPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema checks that name is usable as Relay's schema: lower-case
// letters, digits and underscores, not starting with a digit, at most 63
// bytes.
func ValidateSchema(name string) error {
	if !schemaPattern.MatchString(name) {
		return fmt.Errorf("%w %q: use lower-case letters, digits and underscores, starting with a letter or underscore, at most 63 characters", ErrInvalidSchema, name)
	}
	return nil
}

// New returns a Migrator for Relay's own embedded migrations.
func New(schema string) (*Migrator, error) {
	return Load(embedded, schema)
}

var filePattern = regexp.MustCompile(`^(\d+)_([a-z0-9_]+)\.(up|down)\.sql$`)

// Load reads a migration set from the .sql files at the root of fsys and
// checks it: versions 1..N with no gap or duplicate, each with an up and a
// down file.
func Load(fsys fs.FS, schema string) (*Migrator, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSet, err)
	}
	byVersion := map[int]*Migration{}
	for _, file := range names {
		m := filePattern.FindStringSubmatch(file)
		if m == nil {
			return nil, fmt.Errorf("%w: file %s is not named NNN_name.up.sql or NNN_name.down.sql", ErrInvalidSet, file)
		}
		version, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSet, err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &Migration{Version: version, Name: m[2]}
			byVersion[version] = mig
		} else if mig.Name != m[2] {
			return nil, fmt.Errorf("%w: version %d is used twice (%q and %q)", ErrInvalidSet, version, mig.Name, m[2])
		}
		sql := strings.ReplaceAll(string(body), "{{schema}}", pgx.Identifier{schema}.Sanitize())
		target := &mig.Up
		if m[3] == "down" {
			target = &mig.Down
		}
		if *target != "" {
			return nil, fmt.Errorf("%w: version %d has two %s files", ErrInvalidSet, version, m[3])
		}
		*target = sql
	}
	migrator := &Migrator{schema: schema}
	for v := 1; v <= len(byVersion); v++ {
		mig, ok := byVersion[v]
		if !ok {
			return nil, fmt.Errorf("%w: version %d is missing (versions must run 1..%d without gaps)", ErrInvalidSet, v, len(byVersion))
		}
		if mig.Up == "" || mig.Down == "" {
			return nil, fmt.Errorf("%w: version %d (%s) needs both an up and a down file", ErrInvalidSet, v, mig.Name)
		}
		if mig.CompatibleFrom, err = compatibleFrom(v, mig.Up); err != nil {
			return nil, err
		}
		migrator.migrations = append(migrator.migrations, *mig)
	}
	return migrator, nil
}

// Schema is the schema this Migrator works on.
func (m *Migrator) Schema() string { return m.schema }

// Latest is the highest version this Migrator knows.
func (m *Migrator) Latest() int { return len(m.migrations) }

// Migrations returns the loaded set in version order.
func (m *Migrator) Migrations() []Migration { return append([]Migration(nil), m.migrations...) }

// Step is one migration run (or, in a dry run, one that would run).
type Step struct {
	Version   int
	Name      string
	Direction string
	SQL       string
	// CompatibleFrom is recorded with an up step (Migration.CompatibleFrom).
	CompatibleFrom int
}

// Up applies every pending migration in order. With dryRun it takes the
// lock and reports the steps without running them.
func (m *Migrator) Up(ctx context.Context, conn *pgx.Conn, dryRun bool) ([]Step, error) {
	var steps []Step
	err := m.locked(ctx, conn, func(applied map[int]bool) error {
		if err := m.ensureVersionTable(ctx, conn, dryRun); err != nil {
			return err
		}
		for _, mig := range m.migrations {
			if applied[mig.Version] {
				continue
			}
			if err := m.take(ctx, conn, Step{Version: mig.Version, Name: mig.Name, Direction: "up", SQL: mig.Up, CompatibleFrom: mig.CompatibleFrom}, dryRun, &steps); err != nil {
				return err
			}
		}
		return nil
	})
	return steps, err
}

// Down rolls back applied migrations above version to, newest first. A
// negative to means one step.
func (m *Migrator) Down(ctx context.Context, conn *pgx.Conn, to int, dryRun bool) ([]Step, error) {
	if to > m.Latest() {
		return nil, fmt.Errorf("cannot migrate down to version %d: the latest version is %d", to, m.Latest())
	}
	var steps []Step
	err := m.locked(ctx, conn, func(applied map[int]bool) error {
		current := currentVersion(applied)
		if to < 0 {
			to = max(current-1, 0)
		}
		for v := current; v > to; v-- {
			if !applied[v] {
				continue
			}
			mig := m.migrations[v-1]
			if err := m.take(ctx, conn, Step{Version: v, Name: mig.Name, Direction: "down", SQL: mig.Down}, dryRun, &steps); err != nil {
				return err
			}
		}
		return nil
	})
	return steps, err
}

// take runs step, unless dryRun, and adds it to steps.
func (m *Migrator) take(ctx context.Context, conn *pgx.Conn, step Step, dryRun bool, steps *[]Step) error {
	if !dryRun {
		if err := m.run(ctx, conn, step); err != nil {
			return err
		}
	}
	*steps = append(*steps, step)
	return nil
}

// VersionStatus is the state of one migration version.
type VersionStatus struct {
	Version   int
	Name      string
	Applied   bool
	AppliedAt time.Time
	// Unknown marks a version recorded in the database that this binary does
	// not have: the database was migrated by a newer relay.
	Unknown bool
	// CompatibleFrom is what the database recorded for an applied version
	// (0 when the relay that applied it did not record it).
	CompatibleFrom int
}

// Status is what Status found.
type Status struct {
	Schema   string
	Current  int
	Latest   int
	Versions []VersionStatus
}

// Requires is the oldest latest-version a relay may have to run on this
// database: the highest compatibility bound among the applied versions
// (a version recorded without one counts as its own). It is 0 for an
// empty database.
func (s Status) Requires() int {
	req := 0
	for _, v := range s.Versions {
		if !v.Applied {
			continue
		}
		bound := v.CompatibleFrom
		if bound == 0 {
			bound = v.Version
		}
		req = max(req, bound)
	}
	return req
}

// Pending lists the versions not yet applied.
func (s Status) Pending() []int {
	var p []int
	for _, v := range s.Versions {
		if !v.Applied && !v.Unknown {
			p = append(p, v.Version)
		}
	}
	return p
}

// Status reads the applied versions without changing anything.
func (m *Migrator) Status(ctx context.Context, conn *pgx.Conn) (Status, error) {
	st := Status{Schema: m.schema, Latest: m.Latest()}
	rows, err := m.appliedRows(ctx, conn)
	if err != nil {
		return st, err
	}
	byVersion := map[int]VersionStatus{}
	for _, r := range rows {
		byVersion[r.Version] = r
		st.Current = max(st.Current, r.Version)
	}
	for _, mig := range m.migrations {
		vs := byVersion[mig.Version]
		vs.Version, vs.Name = mig.Version, mig.Name
		st.Versions = append(st.Versions, vs)
		delete(byVersion, mig.Version)
	}
	for _, r := range byVersion {
		r.Unknown = true
		st.Versions = append(st.Versions, r)
	}
	sort.Slice(st.Versions, func(i, j int) bool { return st.Versions[i].Version < st.Versions[j].Version })
	return st, nil
}

// Check returns nil when this binary may run on the database: it is at
// exactly the binary's latest version, or ahead with every newer migration
// compatible with it (see the package comment). It returns ErrPending when
// migrations remain, and ErrSchemaTooNew when the database is ahead beyond
// the binary's compatibility.
func (m *Migrator) Check(ctx context.Context, conn *pgx.Conn) error {
	st, err := m.Status(ctx, conn)
	if err != nil {
		return err
	}
	return m.CheckStatus(st)
}

// CheckStatus is Check on a Status already read.
func (m *Migrator) CheckStatus(st Status) error {
	if st.Current > m.Latest() && st.Requires() > m.Latest() {
		return fmt.Errorf("%w: schema %q is at version %d, whose migrations need a relay that knows version %d, and this relay knows versions up to %d; it was migrated by a newer relay: run that version, or roll back with its `relay migrate down --to %d`",
			ErrSchemaTooNew, m.schema, st.Current, st.Requires(), m.Latest(), m.Latest())
	}
	if p := st.Pending(); len(p) > 0 {
		return fmt.Errorf("%w: schema %q is at version %d, this relay needs %d; run `relay migrate up`", ErrPending, m.schema, st.Current, m.Latest())
	}
	return nil
}

func (m *Migrator) tooNew(current int) error {
	if current > m.Latest() {
		return fmt.Errorf("%w: schema %q is at version %d but this relay knows versions up to %d; it was migrated by a newer relay: run that version, or roll back with its `relay migrate down --to %d`",
			ErrSchemaTooNew, m.schema, current, m.Latest(), m.Latest())
	}
	return nil
}

// locked runs fn holding the schema's migration lock, with the set of
// applied versions read after the lock was taken.
func (m *Migrator) locked(ctx context.Context, conn *pgx.Conn, fn func(applied map[int]bool) error) error {
	key := m.lockKey()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return fmt.Errorf("taking the migration lock: %w", err)
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		conn.Exec(unlockCtx, "SELECT pg_advisory_unlock($1)", key)
	}()
	rows, err := m.appliedRows(ctx, conn)
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	current := 0
	for _, r := range rows {
		applied[r.Version] = true
		current = max(current, r.Version)
	}
	if err := m.tooNew(current); err != nil {
		return err
	}
	return fn(applied)
}

func (m *Migrator) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("relay.migrations." + m.schema))
	return int64(h.Sum64())
}

func (m *Migrator) table() string {
	return pgx.Identifier{m.schema, "schema_migrations"}.Sanitize()
}

func (m *Migrator) ensureVersionTable(ctx context.Context, conn *pgx.Conn, dryRun bool) error {
	if dryRun {
		return nil
	}
	// compatible_from came after the table (v0.2.0): added to a table an
	// older relay made. Relays older than it ignore the column and leave
	// it NULL in the rows they insert.
	_, err := conn.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE %[2]s ADD COLUMN IF NOT EXISTS compatible_from integer`, pgx.Identifier{m.schema}.Sanitize(), m.table()))
	if err != nil {
		return fmt.Errorf("creating the version table: %w", err)
	}
	return nil
}

// appliedRows reads the version table; a missing table means nothing has
// been applied.
func (m *Migrator) appliedRows(ctx context.Context, conn *pgx.Conn) ([]VersionStatus, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.table()).Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading migration versions: %w", err)
	}
	if !exists {
		return nil, nil
	}
	var withCompat bool
	err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
    WHERE attrelid = $1::regclass AND attname = 'compatible_from' AND NOT attisdropped)`, m.table()).Scan(&withCompat)
	if err != nil {
		return nil, fmt.Errorf("reading migration versions: %w", err)
	}
	compat := "NULL::integer"
	if withCompat {
		compat = "compatible_from"
	}
	rows, err := conn.Query(ctx, "SELECT version, name, applied_at, coalesce("+compat+", 0) FROM "+m.table()+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("reading migration versions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (VersionStatus, error) {
		var v VersionStatus
		err := row.Scan(&v.Version, &v.Name, &v.AppliedAt, &v.CompatibleFrom)
		v.Applied = true
		return v, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading migration versions: %w", err)
	}
	return out, nil
}

// run executes one step and its version-row change in one transaction.
func (m *Migrator) run(ctx context.Context, conn *pgx.Conn, step Step) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, step.SQL); err != nil {
			return err
		}
		var err error
		if step.Direction == "up" {
			_, err = tx.Exec(ctx, "INSERT INTO "+m.table()+" (version, name, compatible_from) VALUES ($1, $2, $3)", step.Version, step.Name, step.CompatibleFrom)
		} else {
			_, err = tx.Exec(ctx, "DELETE FROM "+m.table()+" WHERE version = $1", step.Version)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("migration %03d_%s %s: %w", step.Version, step.Name, step.Direction, err)
	}
	return nil
}

func currentVersion(applied map[int]bool) int {
	current := 0
	for v := range applied {
		current = max(current, v)
	}
	return current
}
