package cdc

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/relay/store"
)

// legacySlotName is the default slot name of relays before the default
// named the database: "relay_<schema>", which two databases of one
// cluster cannot both have (slots are per cluster).
func legacySlotName(schema string) string { return "relay_" + schema }

// defaultSlotName is the slot name used when none is configured:
// "relay_<schema>_<database oid>". A database's oid is unique in its
// cluster, and the oid (digits) cannot end a schema name's part, so two
// (schema, database) pairs never share a name. A schema too long to fit
// is replaced by a hash of it.
func defaultSlotName(schema string, dbOID uint32) string {
	oid := strconv.FormatUint(uint64(dbOID), 10)
	name := "relay_" + schema + "_" + oid
	if len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("relay_h%08x_%s", h.Sum32(), oid)
}

// resolveSlot fixes the slot name for the source's life, on its first
// connection: the configured one, else the legacy "relay_<schema>" when
// a slot of that name exists in this database (a relay deployed before
// the default changed keeps its slot and its position), else
// defaultSlotName.
func (s *Source) resolveSlot(ctx context.Context, conn *pgx.Conn) error {
	if s.slot.Load() != nil {
		return nil
	}
	name := s.cfg.SlotName
	if name == "" {
		oid, legacy, err := s.q.SlotNameFacts(ctx, conn, legacySlotName(s.cfg.Schema))
		if err != nil {
			return fmt.Errorf("cdc: choosing the slot name: %w", err)
		}
		name = defaultSlotName(s.cfg.Schema, oid)
		if legacy {
			name = legacySlotName(s.cfg.Schema)
			s.cfg.Logger.Info("using the replication slot of the name earlier relays chose; new deployments get one naming the database",
				"slot", name, "new_default", defaultSlotName(s.cfg.Schema, oid))
		}
	}
	s.slot.Store(&name)
	s.log = s.cfg.Logger.With("source", "cdc", "slot", name)
	return nil
}

// slotName is the slot the source streams from (resolveSlot).
func (s *Source) slotName() string {
	if p := s.slot.Load(); p != nil {
		return *p
	}
	return s.cfg.SlotName
}

// DefaultSlotName is the slot a Source whose Config.SlotName is empty
// streams from in the database db is connected to (the choice of
// resolveSlot), for tools that inspect it without streaming (relay
// doctor).
func DefaultSlotName(ctx context.Context, db store.DB, schema string) (string, error) {
	oid, legacy, err := store.NewCDCReader(schema).SlotNameFacts(ctx, db, legacySlotName(schema))
	if err != nil {
		return "", fmt.Errorf("cdc: choosing the slot name: %w", err)
	}
	if legacy {
		return legacySlotName(schema), nil
	}
	return defaultSlotName(schema, oid), nil
}

// DefaultPublicationName is the publication a Source whose
// Config.PublicationName is empty reads: "relay_<schema>".
func DefaultPublicationName(schema string) string { return "relay_" + schema }
