package cli

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/tablemap"
	"github.com/outboxrelay/relay/migrations"
)

func tableCommand() *command {
	return group("table", "attach an outbox table of another layout (Debezium's) to the relay's outbox, or detach it",
		&command{name: "attach", summary: "copy each row inserted into --table into the outbox, mapped by column (Debezium's layout by default)", run: tableAttach},
		&command{name: "detach", summary: "stop copying the rows of --table", run: tableDetach})
}

func tableAttach(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	var m tablemap.Mapping
	var headers string
	fs := db.flagSet("relay table attach", stdio)
	fs.StringVar(&m.Table, "table", "", "the table services write, as schema.table (required)")
	fs.StringVar(&m.Topic, "topic", "outbox.event.${aggregatetype}", "topic template: text with ${column} placeholders")
	fs.StringVar(&m.Key, "key-column", "aggregateid", "column whose text is the record key (- for none)")
	fs.StringVar(&m.ID, "id-column", "id", "uuid column published as relay-event-id (- for a new uuid per event)")
	fs.StringVar(&m.Payload, "payload-column", "payload", "column published as the record value (bytea as is, other types as UTF-8 text)")
	fs.StringVar(&headers, "header-columns", "type", "columns published as headers named after them, comma-separated (empty for none)")
	fs.StringVar(&m.Timestamp, "timestamp-column", "", "timestamp column published as the record time (default: the time of the INSERT)")
	dryRun := fs.Bool("dry-run", false, "check the mapping and print the SQL, change nothing")
	return db.run(ctx, stdio, fs, args, func(conn *pgx.Conn, _ *migrations.Migrator) error {
		if m.Table == "" {
			return usagef("--table is required")
		}
		m.Schema = db.schema
		m.Headers = []string{}
		for _, h := range strings.Split(headers, ",") {
			if h = strings.TrimSpace(h); h != "" {
				m.Headers = append(m.Headers, h)
			}
		}
		sql, err := tablemap.Attach(ctx, conn, m, *dryRun)
		if err != nil {
			return err
		}
		if *dryRun {
			fmt.Fprint(stdio.Stdout, sql)
			return nil
		}
		fmt.Fprintf(stdio.Stdout, "attached %s to the outbox in schema %s: each row inserted is published to %s\n", m.Table, db.schema, m.Topic)
		return nil
	})
}

func tableDetach(ctx context.Context, stdio IO, args []string) error {
	var db dbFlags
	var table string
	fs := db.flagSet("relay table detach", stdio)
	fs.StringVar(&table, "table", "", "the attached table, as schema.table (required)")
	return db.run(ctx, stdio, fs, args, func(conn *pgx.Conn, _ *migrations.Migrator) error {
		if table == "" {
			return usagef("--table is required")
		}
		if err := tablemap.Detach(ctx, conn, db.schema, table); err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stdout, "detached %s from the outbox in schema %s\n", table, db.schema)
		return nil
	})
}
