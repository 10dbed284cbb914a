package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/migrations"
)

func migrateCommand() *command {
	return group("migrate", "apply, roll back or show Relay's SQL migrations",
		&command{name: "up", summary: "apply every pending migration", run: migrateUp},
		&command{name: "down", summary: "roll back one migration, or down to --to N", run: migrateDown},
		&command{name: "status", summary: "list applied and pending versions", run: migrateStatus, readOnly: true})
}

// dbFlags are the connection flags every database command shares.
type dbFlags struct {
	url    string
	schema string
}

func (d *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL (default: the PG* environment variables)")
	fs.StringVar(&d.schema, "schema", migrations.DefaultSchema, "schema holding the outbox and Relay's tables")
}

// flagSet is a database command's FlagSet, with d's flags on it.
func (d *dbFlags) flagSet(name string, stdio IO) *flag.FlagSet {
	fs := flagSet(name, stdio)
	d.register(fs)
	return fs
}

// run parses fs (holding d's flags) from args, connects, runs do with the
// connection and a Migrator for the schema, and closes the connection.
func (d *dbFlags) run(ctx context.Context, stdio IO, fs *flag.FlagSet, args []string, do func(*pgx.Conn, *migrations.Migrator) error) error {
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	conn, m, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return do(conn, m)
}

// connect validates the flags and opens a connection and a Migrator.
func (d *dbFlags) connect(ctx context.Context) (*pgx.Conn, *migrations.Migrator, error) {
	m, err := migrations.New(d.schema)
	if err != nil {
		return nil, nil, err
	}
	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgconfig.Connect(connectCtx, d.url)
	if err != nil {
		return nil, nil, err
	}
	return conn, m, nil
}

func migrateUp(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	fs := db.flagSet("relay migrate up", stdio)
	dryRun := fs.Bool("dry-run", false, "print the SQL that would run, change nothing")
	return db.run(ctx, stdio, fs, args, func(conn *pgx.Conn, m *migrations.Migrator) error {
		steps, err := m.Up(ctx, conn, *dryRun)
		printSteps(stdio, steps, *dryRun)
		if err != nil {
			return err
		}
		if len(steps) == 0 {
			fmt.Fprintf(stdio.Stdout, "schema %q is up to date at version %d\n", m.Schema(), m.Latest())
		}
		return nil
	})
}

func migrateDown(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	fs := db.flagSet("relay migrate down", stdio)
	dryRun := fs.Bool("dry-run", false, "print the SQL that would run, change nothing")
	to := fs.Int("to", -1, "roll back to this version (0 removes everything); default: one step")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	if *to < -1 {
		return usagef("--to must be 0 or more, got %d", *to)
	}
	conn, m, err := db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	steps, err := m.Down(ctx, conn, *to, *dryRun)
	printSteps(stdio, steps, *dryRun)
	if err != nil {
		return err
	}
	if len(steps) == 0 {
		fmt.Fprintf(stdio.Stdout, "nothing to roll back in schema %q\n", m.Schema())
	}
	return nil
}

func printSteps(stdio IO, steps []migrations.Step, dryRun bool) {
	for _, s := range steps {
		if dryRun {
			fmt.Fprintf(stdio.Stdout, "-- would run %03d_%s %s:\n%s\n", s.Version, s.Name, s.Direction, s.SQL)
			continue
		}
		verb := "applied"
		if s.Direction == "down" {
			verb = "rolled back"
		}
		fmt.Fprintf(stdio.Stdout, "%s %03d_%s\n", verb, s.Version, s.Name)
	}
}

func migrateStatus(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	fs := db.flagSet("relay migrate status", stdio)
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	return db.run(ctx, stdio, fs, args, func(conn *pgx.Conn, m *migrations.Migrator) error {
		st, err := m.Status(ctx, conn)
		if err != nil {
			return err
		}
		if *asJSON {
			type version struct {
				Version   int        `json:"version"`
				Name      string     `json:"name"`
				State     string     `json:"state"`
				AppliedAt *time.Time `json:"applied_at,omitempty"`
			}
			out := struct {
				Schema   string    `json:"schema"`
				Current  int       `json:"current"`
				Latest   int       `json:"latest"`
				Versions []version `json:"versions"`
			}{Schema: st.Schema, Current: st.Current, Latest: st.Latest, Versions: []version{}}
			for _, v := range st.Versions {
				ver := version{Version: v.Version, Name: v.Name, State: versionState(v)}
				if v.Applied {
					at := v.AppliedAt
					ver.AppliedAt = &at
				}
				out.Versions = append(out.Versions, ver)
			}
			enc := json.NewEncoder(stdio.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		fmt.Fprintf(stdio.Stdout, "schema %q: version %d of %d\n", st.Schema, st.Current, st.Latest)
		tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tNAME\tSTATE\tAPPLIED AT")
		for _, v := range st.Versions {
			at := ""
			if v.Applied {
				at = v.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%03d\t%s\t%s\t%s\n", v.Version, v.Name, versionState(v), at)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if st.Current > st.Latest {
			return m.Check(ctx, conn)
		}
		return nil
	})
}

func versionState(v migrations.VersionStatus) string {
	switch {
	case v.Unknown:
		return "applied by a newer relay"
	case v.Applied:
		return "applied"
	default:
		return "pending"
	}
}
