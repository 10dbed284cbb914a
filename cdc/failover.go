package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query returning one row: a *pgx.Conn, *pgxpool.Pool or
// transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// FailoverState is what a server says about a logical slot's failover
// readiness (PostgreSQL 17 and later; see the package documentation,
// "Failover slots").
type FailoverState struct {
	// Supported: the server is PostgreSQL 17 or later.
	Supported bool
	// Standby: the server is in recovery (a standby).
	Standby bool
	// Exists: the slot exists on this server.
	Exists bool
	// Failover: the slot has the failover property, so standbys with
	// sync_replication_slots = on keep a synchronized copy of it.
	Failover bool
	// Synced, on a standby: the slot is a synchronized copy of the
	// primary's (pg_replication_slots.synced).
	Synced bool
	// StandbySlots, on a primary: synchronized_standby_slots, the physical
	// slots of the standbys that must have received the WAL before a
	// logical walsender sends it: those standbys' copies never fall
	// behind what the relay saw.
	StandbySlots []string
	// InactiveStandbySlots are those of StandbySlots that do not exist or
	// that no standby streams from right now.
	InactiveStandbySlots []string
}

// Synchronized tells whether a promotion would find the slot where the
// relay left it: on a standby, the slot is a synchronized copy; on a
// primary, the slot has the failover property and
// synchronized_standby_slots names standbys, all streaming.
func (st FailoverState) Synchronized() bool {
	if st.Standby {
		return st.Synced
	}
	return st.Failover && len(st.StandbySlots) > 0 && len(st.InactiveStandbySlots) == 0
}

// Warning is a one-line description of why the slot would not survive a
// promotion, or "" when it would or the server cannot tell (before
// PostgreSQL 17, failover slots do not exist).
func (st FailoverState) Warning(slot string) string {
	switch {
	case !st.Supported:
		return ""
	case !st.Exists:
		return fmt.Sprintf("replication slot %q does not exist on this server", slot)
	case st.Standby && !st.Synced:
		return fmt.Sprintf("replication slot %q on this standby is not synchronized from the primary", slot)
	case st.Standby:
		return ""
	case !st.Failover:
		return fmt.Sprintf("replication slot %q has no failover property: a promoted standby will not have it and the relay will read the outbox table again (the WAL reader sets it when it starts with --cdc-failover-slot)", slot)
	case len(st.StandbySlots) == 0:
		return fmt.Sprintf("replication slot %q has failover, but synchronized_standby_slots is empty: a standby's copy may lag behind what the relay received", slot)
	case len(st.InactiveStandbySlots) > 0:
		return fmt.Sprintf("replication slot %q: no standby streams from synchronized_standby_slots %s", slot, strings.Join(st.InactiveStandbySlots, ", "))
	}
	return ""
}

// SlotFailoverState reads slot's failover readiness from the server db
// is connected to.
func SlotFailoverState(ctx context.Context, db Querier, slot string) (FailoverState, error) {
	var st FailoverState
	var version int
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, pg_is_in_recovery()").Scan(&version, &st.Standby); err != nil {
		return st, fmt.Errorf("cdc: reading the server version: %w", err)
	}
	if st.Supported = version >= 170000; !st.Supported {
		return st, nil
	}
	err := db.QueryRow(ctx, "SELECT failover, synced FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&st.Failover, &st.Synced)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return st, fmt.Errorf("cdc: reading slot %q: %w", slot, err)
	}
	st.Exists = err == nil
	if st.Standby {
		return st, nil
	}
	var list string
	if err := db.QueryRow(ctx, "SELECT current_setting('synchronized_standby_slots')").Scan(&list); err != nil {
		return st, fmt.Errorf("cdc: reading synchronized_standby_slots: %w", err)
	}
	for _, name := range strings.Split(list, ",") {
		if name = strings.TrimSpace(name); name != "" {
			st.StandbySlots = append(st.StandbySlots, name)
		}
	}
	if len(st.StandbySlots) == 0 {
		return st, nil
	}
	var active []string
	if err := db.QueryRow(ctx, "SELECT coalesce(array_agg(slot_name::text), '{}') FROM pg_replication_slots WHERE slot_type = 'physical' AND active AND slot_name = ANY($1)",
		st.StandbySlots).Scan(&active); err != nil {
		return st, fmt.Errorf("cdc: reading the standby slots: %w", err)
	}
	for _, name := range st.StandbySlots {
		if !slices.Contains(active, name) {
			st.InactiveStandbySlots = append(st.InactiveStandbySlots, name)
		}
	}
	return st, nil
}

// Warnings lists what an operator should know about the running source
// without it making the relay unready: on PostgreSQL 17 and later, that
// its slot would not survive a promotion (FailoverState.Warning). It is
// empty before Start and with Config.NoFailoverSlot.
func (s *Source) Warnings(ctx context.Context) []string {
	s.mu.Lock()
	pool := s.pool
	s.mu.Unlock()
	if pool == nil {
		return nil
	}
	if w := s.failoverWarning(ctx, pool); w != "" {
		return []string{w}
	}
	return nil
}

func (s *Source) failoverWarning(ctx context.Context, db Querier) string {
	if s.cfg.NoFailoverSlot {
		return ""
	}
	st, err := SlotFailoverState(ctx, db, s.slotName())
	if err != nil {
		return err.Error()
	}
	return st.Warning(s.slotName())
}

// ensureFailover gives an existing slot created without the failover
// property (by a relay before PostgreSQL 17, or with NoFailoverSlot) that
// property, on PostgreSQL 17 and later unless NoFailoverSlot is set. The
// slot is not streamed at this point, as ALTER_REPLICATION_SLOT requires.
// A failure is logged, not returned: the slot works without it, and
// Warnings says so.
func (s *Source) ensureFailover(ctx context.Context, conn *pgx.Conn) {
	if s.cfg.NoFailoverSlot {
		return
	}
	st, err := SlotFailoverState(ctx, conn, s.slotName())
	if err != nil || !st.Supported || st.Standby || !st.Exists || st.Failover {
		return
	}
	repl, err := s.connectReplication(ctx, nil)
	if err == nil {
		defer repl.Close(context.WithoutCancel(ctx))
		_, err = repl.Exec(ctx, "ALTER_REPLICATION_SLOT "+s.slotName()+" (FAILOVER true)").ReadAll()
	}
	if err != nil {
		s.log.Warn("could not give the replication slot the failover property", "err", err)
		return
	}
	s.log.Info("gave the replication slot the failover property: standbys with sync_replication_slots = on keep a copy of it")
}
