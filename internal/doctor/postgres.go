package doctor

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
)

// MinServerVersion is the oldest PostgreSQL the relay supports
// (server_version_num).
const MinServerVersion = 140000

// Postgres checks that the server answers and runs PostgreSQL 14 or later.
func (d *Doctor) Postgres(ctx context.Context) Result {
	conn, err := d.db(ctx)
	if err != nil {
		return fail("start PostgreSQL, or point --database-url (or the PG* variables) at it; check host, port, user, password and pg_hba.conf",
			"%s", err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	var num int
	var version string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&num, &version); err != nil {
		return fail("check that the server accepts queries from this role", "reading the server version: %v", pgconfig.Scrub(err, d.cfg.DatabaseURL))
	}
	at := pgconfig.Describe(&conn.Config().Config)
	if num < MinServerVersion {
		return fail("upgrade PostgreSQL to 14 or later", "PostgreSQL %s at %s is older than 14, the oldest the relay supports", version, at)
	}
	return pass("PostgreSQL %s at %s", version, at)
}

// Schema checks that the outbox schema is migrated to this relay's
// version: a schema ahead of it within the compatibility range its newer
// migrations recorded (a rolling upgrade in progress) is a warning.
func (d *Doctor) Schema(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		m, err := migrations.New(d.cfg.Schema)
		if err != nil {
			return fail("choose a valid --schema", "%v", err)
		}
		st, err := m.Status(ctx, conn)
		if err != nil {
			return fail("grant the relay's role USAGE on schema "+d.cfg.Schema+" and SELECT on its tables", "%v", pgconfig.Scrub(err, d.cfg.DatabaseURL))
		}
		up := "run `relay migrate up --schema " + d.cfg.Schema + "`"
		switch {
		case st.Current == 0:
			return fail(up, "schema %q holds no relay tables (migration version 0, this relay needs %d)", d.cfg.Schema, st.Latest)
		case st.Current > st.Latest && m.CheckStatus(st) == nil:
			return warn("replace this relay with the release that migrated the schema (docs/upgrading.md)",
				"schema %q is at version %d, ahead of this relay's %d; its newer migrations keep this relay compatible", d.cfg.Schema, st.Current, st.Latest)
		case st.Current > st.Latest:
			return fail(fmt.Sprintf("run the newer relay, or roll back with its `relay migrate down --to %d`", st.Latest),
				"this relay is older than the schema: %q is at version %d, this relay knows versions up to %d", d.cfg.Schema, st.Current, st.Latest)
		case len(st.Pending()) > 0:
			return fail(up, "schema %q is at version %d, this relay needs %d (pending: %v)", d.cfg.Schema, st.Current, st.Latest, st.Pending())
		}
		return pass("schema %q is at version %d, this relay's", d.cfg.Schema, st.Current)
	})
}

// privilege is a privilege the relay uses on one of its tables.
type privilege struct{ table, priv string }

// neededPrivileges are the table privileges the relay uses with source:
// the reader's (poll_ticks for poll, cdc_slots for cdc), and those of the
// core for both (reading and deleting published events, the checkpoint,
// the leadership, dead letters, the archive and replay requests).
func neededPrivileges(source string) []privilege {
	p := []privilege{
		{"events", "SELECT"}, {"events", "DELETE"},
		{"checkpoints", "SELECT"}, {"checkpoints", "INSERT"}, {"checkpoints", "UPDATE"},
		{"leadership", "SELECT"}, {"leadership", "INSERT"}, {"leadership", "UPDATE"},
		{"leader_lease", "SELECT"}, {"leader_lease", "INSERT"}, {"leader_lease", "UPDATE"},
		{"dead_letters", "SELECT"}, {"dead_letters", "INSERT"}, {"dead_letters", "UPDATE"}, {"dead_letters", "DELETE"},
		{"events_archive", "SELECT"}, {"events_archive", "INSERT"}, {"events_archive", "DELETE"},
		{"replay_requests", "SELECT"}, {"replay_requests", "UPDATE"},
	}
	if source == "cdc" {
		return append(p, privilege{"cdc_slots", "SELECT"}, privilege{"cdc_slots", "INSERT"}, privilege{"cdc_slots", "UPDATE"}, privilege{"cdc_slots", "DELETE"})
	}
	return append(p, privilege{"poll_ticks", "SELECT"}, privilege{"poll_ticks", "INSERT"}, privilege{"poll_ticks", "DELETE"})
}

// Privileges checks that the role holds the table privileges the relay
// uses with its reader; tables the schema lacks are left to Schema.
func (d *Doctor) Privileges(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		var role string
		var usage bool
		err := conn.QueryRow(ctx, `SELECT current_user, coalesce((SELECT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = $1), true)`,
			d.cfg.Schema).Scan(&role, &usage)
		if err != nil {
			return fail("check that the server accepts queries from this role", "reading the role's privileges: %v", pgconfig.Scrub(err, d.cfg.DatabaseURL))
		}
		schema := pgx.Identifier{d.cfg.Schema}.Sanitize()
		if !usage {
			return fail("GRANT USAGE ON SCHEMA "+schema+" TO "+pgx.Identifier{role}.Sanitize(), "role %q may not use schema %q", role, d.cfg.Schema)
		}
		missing := map[string][]string{}
		var tables []string
		for _, p := range neededPrivileges(d.cfg.Source) {
			var ok bool
			qualified := pgx.Identifier{d.cfg.Schema, p.table}.Sanitize()
			if err := conn.QueryRow(ctx, `SELECT to_regclass($1) IS NULL OR has_table_privilege(to_regclass($1), $2)`, qualified, p.priv).Scan(&ok); err != nil {
				return fail("check that the server accepts queries from this role", "reading the role's privileges: %v", pgconfig.Scrub(err, d.cfg.DatabaseURL))
			}
			if !ok {
				if missing[qualified] == nil {
					tables = append(tables, qualified)
				}
				missing[qualified] = append(missing[qualified], p.priv)
			}
		}
		if len(tables) == 0 {
			return pass("role %q holds the privileges the %s reader and the relay use on schema %q", role, d.cfg.Source, d.cfg.Schema)
		}
		var lacks, grants []string
		for _, t := range tables {
			lacks = append(lacks, t+" ("+strings.Join(missing[t], ", ")+")")
			grants = append(grants, "GRANT "+strings.Join(missing[t], ", ")+" ON "+t+" TO "+pgx.Identifier{role}.Sanitize())
		}
		return fail(strings.Join(grants, "; "), "role %q lacks privileges the relay uses: %s", role, strings.Join(lacks, "; "))
	})
}
