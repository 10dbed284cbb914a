package doctor

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/relay/store"
)

const usePoll = "; or run with --source poll"

func (d *Doctor) queryFailed(what string, err error) Result {
	return fail("check that the server accepts queries from this role", "%s: %v", what, pgconfig.Scrub(err, d.cfg.DatabaseURL))
}

// WALLevel checks that the server runs with wal_level = logical.
func (d *Doctor) WALLevel(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		level, err := store.NewCDCReader(d.cfg.Schema).WALLevel(ctx, conn)
		if err != nil {
			return d.queryFailed("reading wal_level", err)
		}
		if level != "logical" {
			return fail("ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf) and restart PostgreSQL"+usePoll,
				"wal_level = %s; the cdc reader needs wal_level = logical", level)
		}
		return pass("wal_level = logical")
	})
}

// ReplicationRole checks that the role may stream changes: REPLICATION or
// superuser.
func (d *Doctor) ReplicationRole(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		role, super, replication, err := store.NewCDCReader(d.cfg.Schema).Role(ctx, conn)
		if err != nil {
			return d.queryFailed("reading the role's attributes", err)
		}
		switch {
		case super:
			return pass("role %q is a superuser", role)
		case replication:
			return pass("role %q has the REPLICATION attribute", role)
		}
		return fail("ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" REPLICATION"+usePoll,
			"role %q has neither REPLICATION nor superuser: it may not stream changes", role)
	})
}

// slotName is the slot the cdc reader would use.
func (d *Doctor) slotName(ctx context.Context, conn *pgx.Conn) (string, error) {
	if d.cfg.Slot != "" {
		return d.cfg.Slot, nil
	}
	return cdc.DefaultSlotName(ctx, conn, d.cfg.Schema)
}

// ReplicationSlots checks that the reader's slot exists or that
// max_replication_slots leaves room to create it.
func (d *Doctor) ReplicationSlots(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		q := store.NewCDCReader(d.cfg.Schema)
		used, limit, err := q.SlotCount(ctx, conn)
		if err != nil {
			return d.queryFailed("counting replication slots", err)
		}
		name, err := d.slotName(ctx, conn)
		if err != nil {
			return d.queryFailed("choosing the slot name", err)
		}
		_, found, err := q.Slot(ctx, conn, name)
		if err != nil {
			return d.queryFailed("reading the replication slot", err)
		}
		if found {
			return pass("slot %q exists; %d of max_replication_slots = %d in use", name, used, limit)
		}
		if used >= limit {
			return fail("drop an unused slot (SELECT pg_drop_replication_slot(name)) or raise max_replication_slots and restart PostgreSQL",
				"%d of max_replication_slots = %d are in use: no room for slot %q", used, limit, name)
		}
		return pass("%d of max_replication_slots = %d in use: room for slot %q", used, limit, name)
	})
}

// WALSenders checks that max_wal_senders leaves a WAL sender free for the
// reader's stream (or that the stream already holds one).
func (d *Doctor) WALSenders(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		var limit, used int
		err := conn.QueryRow(ctx, `SELECT current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)::int`).Scan(&limit, &used)
		if err != nil {
			return d.queryFailed("counting WAL senders", err)
		}
		name, err := d.slotName(ctx, conn)
		if err != nil {
			return d.queryFailed("choosing the slot name", err)
		}
		st, found, err := store.NewCDCReader(d.cfg.Schema).Slot(ctx, conn, name)
		if err != nil {
			return d.queryFailed("reading the replication slot", err)
		}
		if found && st.ActivePID != 0 {
			return pass("%d of max_wal_senders = %d in use, one of them streaming slot %q", used, limit, name)
		}
		if used >= limit {
			return fail("raise max_wal_senders and restart PostgreSQL, or stop an unused replication client",
				"%d of max_wal_senders = %d are in use: no WAL sender free for the relay's stream", used, limit)
		}
		return pass("%d of max_wal_senders = %d in use", used, limit)
	})
}

// Publication checks that the publication publishes the outbox table's
// inserts, or that the role may create it.
func (d *Doctor) Publication(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		name := d.cfg.Publication
		if name == "" {
			name = cdc.DefaultPublicationName(d.cfg.Schema)
		}
		table := pgx.Identifier{d.cfg.Schema, "events"}.Sanitize()
		q := store.NewCDCReader(d.cfg.Schema)
		p, found, err := q.Publication(ctx, conn, name)
		if err != nil {
			return d.queryFailed("reading the publication", err)
		}
		if found {
			switch {
			case !p.Covers:
				return fail(fmt.Sprintf("ALTER PUBLICATION %s ADD TABLE %s, or drop the publication and let the relay create it", name, table),
					"publication %q exists but does not publish %s", name, table)
			case !p.Inserts:
				return fail(fmt.Sprintf("ALTER PUBLICATION %s SET (publish = 'insert'), or drop the publication and let the relay create it", name),
					"publication %q exists but does not publish inserts", name)
			}
			return pass("publication %q publishes the inserts of %s", name, table)
		}
		var exists, canCreate bool
		// From the catalog, which any role may read: to_regclass needs
		// USAGE on the schema.
		err = conn.QueryRow(ctx, `SELECT c.oid IS NOT NULL,
    coalesce((SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
        OR (has_database_privilege(current_database(), 'CREATE') AND pg_has_role(c.relowner, 'USAGE')), false)
FROM (SELECT 1) AS one
LEFT JOIN pg_namespace AS n ON n.nspname = $1
LEFT JOIN pg_class AS c ON c.relnamespace = n.oid AND c.relname = 'events'`, d.cfg.Schema).Scan(&exists, &canCreate)
		if err != nil {
			return d.queryFailed("reading the right to create the publication", err)
		}
		switch {
		case !exists:
			return Result{Status: Skip, Detail: table + " is missing (see the schema check)"}
		case !canCreate:
			return fail(fmt.Sprintf("as the table's owner or a superuser: CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')", name, table),
				"publication %q is missing and this role may not create it (it needs CREATE on the database and ownership of %s)", name, table)
		}
		return pass("publication %q is missing; the relay creates it at start", name)
	})
}

// Slot checks the reader's replication slot: a slot the server has
// invalidated (wal_status = lost), or one of another kind or database,
// fails; one streaming to another process is a warning; a missing one is
// created by the relay.
func (d *Doctor) Slot(ctx context.Context) Result {
	return d.withDB(ctx, func(ctx context.Context, conn *pgx.Conn) Result {
		q := store.NewCDCReader(d.cfg.Schema)
		name, err := d.slotName(ctx, conn)
		if err != nil {
			return d.queryFailed("choosing the slot name", err)
		}
		st, found, err := q.Slot(ctx, conn, name)
		if err != nil {
			return d.queryFailed("reading the replication slot", err)
		}
		if !found {
			return pass("slot %q is missing; the relay creates it at start and publishes the outbox rows already there from the table", name)
		}
		database, err := q.Database(ctx, conn)
		if err != nil {
			return d.queryFailed("reading the database name", err)
		}
		switch {
		case st.WALStatus == "lost":
			return fail("raise max_slot_wal_keep_size (or keep the relay running) so it does not recur; the relay recreates the slot at start and publishes every unpublished outbox row again from the table",
				"slot %q was invalidated by the server (wal_status = lost): WAL it needed was removed", name)
		case st.Type != "logical" || st.Plugin != "pgoutput" || st.Database != database:
			return fail("choose another --slot, or drop this one (SELECT pg_drop_replication_slot('"+name+"'))",
				"slot %q is a %s slot with plugin %q in database %q; the relay needs a logical pgoutput slot in %q", name, st.Type, st.Plugin, st.Database, database)
		case st.ActivePID != 0:
			return warn("if no other relay should be streaming this outbox, stop process "+fmt.Sprint(st.ActivePID)+" (SELECT pg_terminate_backend("+fmt.Sprint(st.ActivePID)+"))",
				"slot %q is streaming to server process %d (another relay leading this outbox?); this relay waits as a standby", name, st.ActivePID)
		case st.WALStatus == "unreserved":
			return warn("start the relay soon, or raise max_slot_wal_keep_size", "slot %q is about to be invalidated (wal_status = unreserved)", name)
		}
		return pass("slot %q is a logical pgoutput slot in %q, confirmed up to %s", name, database, st.ConfirmedFlush)
	})
}
