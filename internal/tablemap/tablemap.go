// Package tablemap attaches an outbox table of another layout, such as the
// one Debezium's Outbox Event Router reads (id uuid, aggregatetype,
// aggregateid, type, payload, and any extra columns), to the relay's
// outbox, so that services keep writing it with their own INSERTs.
//
// Attach validates a Mapping against the table's columns and installs,
// in one transaction, an AFTER INSERT row trigger on that table whose
// function writes one row into <schema>.events per row inserted: topic
// from a template over the row's columns (Debezium's default
// "outbox.event.${aggregatetype}"), key from a column (aggregateid), the
// payload column as the payload (bytea as is, any other type as its text
// in UTF-8), the chosen columns as headers (column name: value as text, a
// NULL left out), the id column as the event id, and optionally a
// timestamp column as the creation time.
//
// # Fault model
//
// The copy is written by the service's own transaction, in the statement
// that inserted the row, so it commits or rolls back with it (savepoints
// included): nothing is lost or published that did not commit, and from
// <schema>.events on, both readers carry the event with every guarantee
// of a row written there directly (commit order per key, exactly once
// into the embedded log, SIGKILLs). The foreign table is left alone: rows
// the service deletes after inserting them (Debezium's advice to keep the
// table empty) are still published, as Debezium publishes the insert; the
// relay never deletes from it. Bad values do not fail the service's
// transaction where the relay can dead-letter them instead: a NULL in a
// topic template's column makes a topic no Kafka topic can be (it names
// the column), which the relay dead-letters as invalid_topic. A value
// that cannot be cast (an id column of text holding no uuid) does fail
// the INSERT, with PostgreSQL's error. Detach removes the trigger and its
// function; events already copied stay in the outbox and are published.
// A schema change of the foreign table that drops or retypes a mapped
// column makes the trigger fail the inserts (PostgreSQL's error names the
// column): attach again after such a change. TestDebeziumLayout
// (internal/contract) runs Debezium's documented DDL with both readers
// and SIGKILLs.
package tablemap

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Mapping says how the columns of a foreign outbox table become events.
// WithDefaults fills in Debezium's layout.
type Mapping struct {
	// Schema is the relay's schema (default "outbox").
	Schema string
	// Table is the foreign table, as schema.table (or a table on the
	// search path).
	Table string
	// Topic is the topic template: text with ${column} placeholders
	// (default "outbox.event.${aggregatetype}").
	Topic string
	// Key is the column whose text is the record key (default
	// "aggregateid"); "-" for none.
	Key string
	// ID is the uuid (or uuid-text) column published as relay-event-id
	// (default "id"); "-" for a new uuid per event.
	ID string
	// Payload is the value's column (default "payload").
	Payload string
	// Headers are the columns published as headers, named after them
	// (default: "type").
	Headers []string
	// Timestamp is a timestamp column to publish as the record's time
	// (default none: the time of the INSERT).
	Timestamp string
}

// None marks an optional column left unmapped.
const None = "-"

// WithDefaults returns m with Debezium's defaults in its empty fields.
func (m Mapping) WithDefaults() Mapping {
	if m.Schema == "" {
		m.Schema = "outbox"
	}
	if m.Topic == "" {
		m.Topic = "outbox.event.${aggregatetype}"
	}
	if m.Key == "" {
		m.Key = "aggregateid"
	}
	if m.ID == "" {
		m.ID = "id"
	}
	if m.Payload == "" {
		m.Payload = "payload"
	}
	if m.Headers == nil {
		m.Headers = []string{"type"}
	}
	return m
}

// ErrMapping means a Mapping does not fit its table.
var ErrMapping = errors.New("tablemap: the mapping does not fit the table")

var placeholder = regexp.MustCompile(`\$\{([^}]*)\}`)

// table is what Attach learned of the foreign table.
type table struct {
	oid    uint32
	name   string // quoted schema.table
	plain  string // schema.table as PostgreSQL prints it
	schema string
	rel    string
	cols   map[string]string // column name to its type (format_type)
}

func lookup(ctx context.Context, q pgx.Tx, name string) (table, error) {
	t := table{cols: map[string]string{}}
	err := q.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')`, name).Scan(&t.oid, &t.schema, &t.rel)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, fmt.Errorf("%w: there is no table %q", ErrMapping, name)
	}
	if err != nil {
		return t, fmt.Errorf("tablemap: looking up %q: %w", name, err)
	}
	t.name = pgx.Identifier{t.schema, t.rel}.Sanitize()
	t.plain = t.schema + "." + t.rel
	rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`, t.oid)
	if err != nil {
		return t, fmt.Errorf("tablemap: reading the columns of %s: %w", t.plain, err)
	}
	defer rows.Close()
	for rows.Next() {
		var col, typ string
		if err := rows.Scan(&col, &typ); err != nil {
			return t, err
		}
		t.cols[col] = typ
	}
	return t, rows.Err()
}

// names are the trigger and function of one attachment: the trigger is
// named after the relay's schema (one attachment per outbox and table),
// the function, in the relay's schema, after the table.
func names(m Mapping, t table) (trigger, function string) {
	fn := "from_" + t.schema + "_" + t.rel
	if len(fn) > 63 {
		h := fnv.New32a()
		h.Write([]byte(t.plain))
		fn = fmt.Sprintf("%s_%08x", fn[:50], h.Sum32())
	}
	return "relay_" + m.Schema, pgx.Identifier{m.Schema, fn}.Sanitize()
}

// functionSQL is the trigger function's definition for m on t.
func functionSQL(m Mapping, t table, function string) (string, error) {
	col := func(what, name string) (string, string, error) {
		typ, ok := t.cols[name]
		if !ok {
			return "", "", fmt.Errorf("%w: %s column %q is not a column of %s (it has %s)", ErrMapping, what, name, t.plain, columnList(t))
		}
		return "NEW." + pgx.Identifier{name}.Sanitize(), typ, nil
	}
	var topic []string
	last := 0
	for _, loc := range placeholder.FindAllStringSubmatchIndex(m.Topic, -1) {
		if lit := m.Topic[last:loc[0]]; lit != "" {
			topic = append(topic, literal(lit))
		}
		name := m.Topic[loc[2]:loc[3]]
		ref, _, err := col("topic template", name)
		if err != nil {
			return "", err
		}
		// A NULL makes a topic no Kafka topic can be, naming the column:
		// the relay dead-letters it (invalid_topic) instead of the
		// service's INSERT failing.
		topic = append(topic, "coalesce("+ref+"::text, "+literal("${"+name+"} is NULL")+")")
		last = loc[1]
	}
	if rest := m.Topic[last:]; rest != "" {
		topic = append(topic, literal(rest))
	}
	if len(topic) == 0 {
		return "", fmt.Errorf("%w: the topic template is empty", ErrMapping)
	}
	key := "NULL"
	if m.Key != None {
		ref, _, err := col("key", m.Key)
		if err != nil {
			return "", err
		}
		key = ref + "::text"
	}
	eventID := "gen_random_uuid()"
	if m.ID != None {
		ref, typ, err := col("id", m.ID)
		if err != nil {
			return "", err
		}
		switch {
		case typ == "uuid":
			eventID = "coalesce(" + ref + ", gen_random_uuid())"
		case typ == "text" || strings.HasPrefix(typ, "character"):
			eventID = "coalesce(" + ref + "::text::uuid, gen_random_uuid())"
		default:
			return "", fmt.Errorf("%w: id column %q is %s; the event id must be a uuid (or text holding one), or --id-column %s for a new one per event", ErrMapping, m.ID, typ, None)
		}
	}
	ref, typ, err := col("payload", m.Payload)
	if err != nil {
		return "", err
	}
	payload := ref
	if typ != "bytea" {
		payload = "convert_to(" + ref + "::text, 'UTF8')"
	}
	var pairs []string
	seen := map[string]bool{}
	for _, h := range m.Headers {
		if seen[h] {
			return "", fmt.Errorf("%w: header column %q is named twice", ErrMapping, h)
		}
		seen[h] = true
		ref, _, err := col("header", h)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(h, "relay-") {
			return "", fmt.Errorf("%w: header column %q: header names starting with relay- are the relay's", ErrMapping, h)
		}
		pairs = append(pairs, literal(h)+", "+ref+"::text")
	}
	headers := "NULL"
	if len(pairs) > 0 {
		headers = "jsonb_strip_nulls(jsonb_build_object(" + strings.Join(pairs, ", ") + "))"
	}
	cols, vals := "event_id, topic, key, payload, headers", eventID+", "+strings.Join(topic, " || ")+", "+key+", "+payload+", "+headers
	if m.Timestamp != "" && m.Timestamp != None {
		ref, typ, err := col("timestamp", m.Timestamp)
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(typ, "timestamp") {
			return "", fmt.Errorf("%w: timestamp column %q is %s, not a timestamp", ErrMapping, m.Timestamp, typ)
		}
		cols += ", created_at"
		vals += ", coalesce(" + ref + ", clock_timestamp())"
	}
	events := pgx.Identifier{m.Schema, "events"}.Sanitize()
	return `CREATE OR REPLACE FUNCTION ` + function + `() RETURNS trigger
LANGUAGE plpgsql
AS $relay$
BEGIN
    INSERT INTO ` + events + ` (` + cols + `)
    VALUES (` + vals + `);
    RETURN NULL;
END
$relay$`, nil
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func columnList(t table) string {
	var cols []string
	for c := range t.cols {
		cols = append(cols, c)
	}
	if len(cols) == 0 {
		return "no columns"
	}
	sort.Strings(cols)
	return strings.Join(cols, ", ")
}

// Attach installs m's trigger on its table, replacing an earlier
// attachment of the same table to the same outbox. It returns the SQL it
// ran. With dryRun it runs nothing but the checks.
func Attach(ctx context.Context, conn *pgx.Conn, m Mapping, dryRun bool) (string, error) {
	m = m.WithDefaults()
	var sql string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var events bool
		if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", pgx.Identifier{m.Schema, "events"}.Sanitize()).Scan(&events); err != nil {
			return err
		}
		if !events {
			return fmt.Errorf("%w: the outbox %s.events is missing; run relay migrate up --schema %s first", ErrMapping, m.Schema, m.Schema)
		}
		t, err := lookup(ctx, tx, m.Table)
		if err != nil {
			return err
		}
		trigger, function := names(m, t)
		fn, err := functionSQL(m, t, function)
		if err != nil {
			return err
		}
		// CREATE OR REPLACE TRIGGER needs PostgreSQL 14; dropping and
		// creating in this transaction works everywhere.
		stmts := []string{fn,
			"DROP TRIGGER IF EXISTS " + pgx.Identifier{trigger}.Sanitize() + " ON " + t.name,
			"CREATE TRIGGER " + pgx.Identifier{trigger}.Sanitize() + " AFTER INSERT ON " + t.name +
				"\n    FOR EACH ROW EXECUTE FUNCTION " + function + "()"}
		sql = strings.Join(stmts, ";\n") + ";\n"
		if dryRun {
			return nil
		}
		for _, stmt := range stmts {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("tablemap: attaching %s: %w", t.plain, err)
			}
		}
		return nil
	})
	return sql, err
}

// Detach removes the attachment of table to the outbox in schema; events
// already copied stay in the outbox. Detaching a table that is not
// attached is an error.
func Detach(ctx context.Context, conn *pgx.Conn, schema, tableName string) error {
	m := Mapping{Schema: schema, Table: tableName}.WithDefaults()
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		t, err := lookup(ctx, tx, m.Table)
		if err != nil {
			return err
		}
		trigger, function := names(m, t)
		var found bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1 AND tgname = $2)", t.oid, trigger).Scan(&found); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("%w: %s is not attached to the outbox in schema %s", ErrMapping, t.plain, m.Schema)
		}
		if _, err := tx.Exec(ctx, "DROP TRIGGER "+pgx.Identifier{trigger}.Sanitize()+" ON "+t.name); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DROP FUNCTION IF EXISTS "+function+"()")
		return err
	})
}
