package poller

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrLogicalMessages means the outbox's WAL-reader slot still exists and
// emit_message has written logical messages to it: the poll reader cannot
// see them, so it refuses to start rather than leave them unpublished.
var ErrLogicalMessages = errors.New("poller: the outbox has logical messages only the WAL reader can publish")

// refuseMessages fails when a replication slot of the WAL reader of this
// outbox exists in this database and emit_message has written to it
// (migration 012 marks its cdc_slots row). Such messages live only in the
// slot's WAL.
func (p *Poller) refuseMessages(ctx context.Context, conn *pgx.Conn) error {
	slot, found, err := p.q.MessagesSlot(ctx, conn)
	if err != nil {
		return fmt.Errorf("poller: looking for the WAL reader's messages: %w", err)
	}
	if !found {
		return nil
	}
	return fmt.Errorf("%w: %s.emit_message wrote messages to the replication slot %q, and those not yet published are in its WAL; run the relay with --source cdc until every service writes rows instead and the slot has caught up, then stop it and drop the slot (SELECT pg_drop_replication_slot('%s')) to switch to the poll reader",
		ErrLogicalMessages, p.cfg.Schema, slot, slot)
}
