package cdc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/relay/store"
)

// preflight checks what streaming needs and creates the publication when
// it is missing. Each failure is one error wrapping one of the Err*
// sentinels.
func (s *Source) preflight(ctx context.Context, conn *pgx.Conn) error {
	walLevel, err := s.q.WALLevel(ctx, conn)
	if err != nil {
		return fmt.Errorf("cdc: reading wal_level: %w", err)
	}
	if walLevel != "logical" {
		return fmt.Errorf("%w: the server runs with wal_level = %s; set wal_level = logical in postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL, or use the polling source",
			ErrWALLevel, walLevel)
	}

	role, super, replication, err := s.q.Role(ctx, conn)
	if err != nil {
		return fmt.Errorf("cdc: reading the role's attributes: %w", err)
	}
	if !super && !replication {
		return fmt.Errorf("%w: role %q may not stream changes; grant it with ALTER ROLE %s REPLICATION, or use the polling source",
			ErrReplicationPrivilege, role, pgx.Identifier{role}.Sanitize())
	}

	exists, err := s.q.OutboxExists(ctx, conn)
	if err != nil {
		return fmt.Errorf("cdc: looking for the outbox table: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w: %s is missing; run `relay migrate up --schema %s` first", ErrNoOutbox, s.table, s.cfg.Schema)
	}
	return s.ensurePublication(ctx, conn)
}

// ensurePublication creates the publication when it is missing, and
// otherwise checks that it publishes the outbox table's inserts.
func (s *Source) ensurePublication(ctx context.Context, conn *pgx.Conn) error {
	pub := s.cfg.PublicationName
	for attempt := 0; ; attempt++ {
		p, found, err := s.q.Publication(ctx, conn, pub)
		if err != nil {
			return fmt.Errorf("cdc: reading publication %q: %w", pub, err)
		}
		if found {
			var fix []string
			if !p.Covers {
				fix = append(fix, "ALTER PUBLICATION "+pub+" ADD TABLE "+s.table)
			}
			if !p.Inserts {
				fix = append(fix, "ALTER PUBLICATION "+pub+" SET (publish = 'insert')")
			}
			if len(fix) > 0 {
				return fmt.Errorf("%w: publication %q exists but does not publish the inserts of %s; run %s, or drop the publication and let the relay create it",
					ErrPublication, pub, s.table, strings.Join(fix, " and "))
			}
			return nil
		}
		err = s.q.CreatePublication(ctx, conn, pub)
		if err == nil {
			s.log.Info("created the publication", "publication", pub, "table", s.table)
			return nil
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42710" && attempt == 0 {
			continue // created by someone else meanwhile: check it
		}
		return fmt.Errorf("cdc: creating publication %q for %s: %w", pub, s.table, err)
	}
}

// slotState is the slot's row in pg_replication_slots.
type slotState struct {
	exists    bool
	plugin    string
	slotType  string
	database  string
	activePID int32
	walStatus string
	confirmed pglogrepl.LSN
}

func (st slotState) lost() bool { return st.exists && st.walStatus == "lost" }

// readSlot reads the slot's state; a missing slot is not an error.
func (s *Source) readSlot(ctx context.Context, db store.DB, name string) (slotState, error) {
	row, found, err := s.q.Slot(ctx, db, name)
	if err != nil {
		return slotState{exists: true}, fmt.Errorf("cdc: reading replication slot %q: %w", name, err)
	}
	if !found {
		return slotState{}, nil
	}
	st := slotState{exists: true, plugin: row.Plugin, slotType: row.Type, database: row.Database,
		activePID: row.ActivePID, walStatus: row.WALStatus}
	if row.ConfirmedFlush != "" {
		if st.confirmed, err = pglogrepl.ParseLSN(row.ConfirmedFlush); err != nil {
			return st, fmt.Errorf("cdc: slot %q: %w", name, err)
		}
	}
	return st, nil
}

// usable checks that an existing slot can serve this source.
func (st slotState) usable(name, database string) error {
	if st.slotType != "logical" || st.plugin != "pgoutput" || st.database != database {
		return fmt.Errorf("%w: slot %q is a %s slot with plugin %q in database %q, this source needs a logical pgoutput slot in %q; choose another slot name or drop it",
			ErrSlotMismatch, name, st.slotType, st.plugin, st.database, database)
	}
	if st.activePID != 0 {
		return &SlotActiveError{Slot: name, PID: st.activePID}
	}
	return nil
}

// checkFreeSlot fails with ErrNoFreeSlot when no slot can be created.
func (s *Source) checkFreeSlot(ctx context.Context, db store.DB) error {
	used, limit, err := s.q.SlotCount(ctx, db)
	if err != nil {
		return fmt.Errorf("cdc: counting replication slots: %w", err)
	}
	if used >= limit {
		return noFreeSlot(used, limit)
	}
	return nil
}

func noFreeSlot(used, limit int) error {
	return fmt.Errorf("%w: %d of max_replication_slots = %d are in use; drop an unused slot (SELECT pg_drop_replication_slot(name)) or raise max_replication_slots and restart PostgreSQL",
		ErrNoFreeSlot, used, limit)
}
