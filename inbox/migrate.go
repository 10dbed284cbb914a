package inbox

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

// Migration is one versioned step of the inbox's schema.
type Migration struct {
	Version int
	Name    string
	// SQL is the step for one schema, its name already substituted.
	SQL string
}

// Migrations returns the inbox's migrations for schema ("" means
// DefaultSchema), in order: for teams that apply migrations with their own
// tool. Each step must run in one transaction; Migrate also records each
// version in SCHEMA.schema_version.
func Migrations(schema string) ([]Migration, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	quoted := pgx.Identifier{schema}.Sanitize()
	var out []Migration
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".up.sql")
		num, label, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("inbox: migration file %q is not NNN_name.up.sql", e.Name())
		}
		body, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: label, SQL: strings.ReplaceAll(string(body), "{{schema}}", quoted)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("inbox: migration %d is missing or duplicated (found %d at position %d)", i+1, m.Version, i+1)
		}
	}
	return out, nil
}

// Migrate creates or upgrades the inbox tables in schema ("" means
// DefaultSchema): each missing migration runs in its own transaction
// together with its version row, under an advisory lock so that consumers
// starting side by side migrate once. A schema newer than this package is
// refused.
func Migrate(ctx context.Context, db DB, schema string) error {
	if schema == "" {
		schema = DefaultSchema
	}
	ms, err := Migrations(schema)
	if err != nil {
		return err
	}
	quoted := pgx.Identifier{schema}.Sanitize()
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('relay-inbox-migrate:' || $1))`, schema); err != nil {
		return fmt.Errorf("inbox: migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+quoted); err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+quoted+`.schema_version (
		version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+quoted+`.schema_version`).Scan(&have); err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	if have > len(ms) {
		return fmt.Errorf("inbox: schema %s is at version %d, newer than this package's %d: upgrade the consumer", schema, have, len(ms))
	}
	for _, m := range ms[have:] {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("inbox: migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+quoted+`.schema_version (version) VALUES ($1)`, m.Version); err != nil {
			return fmt.Errorf("inbox: migration %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: migrate: %w", err)
	}
	return nil
}

// checkSchema reports whether schema holds the migrations this package
// needs, with the fix when it does not.
func checkSchema(ctx context.Context, db DB, schema string) error {
	ms, err := Migrations(schema)
	if err != nil {
		return err
	}
	var have int
	err = db.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+pgx.Identifier{schema, "schema_version"}.Sanitize()).Scan(&have)
	if err != nil {
		return fmt.Errorf("inbox: schema %s is not migrated (call inbox.Migrate or apply inbox.Migrations): %w", schema, err)
	}
	if have != len(ms) {
		return fmt.Errorf("inbox: schema %s is at version %d, this package needs %d: call inbox.Migrate", schema, have, len(ms))
	}
	return nil
}
