package cdc

import (
	"errors"
	"fmt"
)

// Preflight failures. Start returns them wrapped in a message that says
// what was found and how to fix it; test with errors.Is.
var (
	// ErrWALLevel means the server's wal_level is not logical.
	ErrWALLevel = errors.New("cdc: wal_level must be logical")
	// ErrReplicationPrivilege means the role may not stream changes.
	ErrReplicationPrivilege = errors.New("cdc: the role lacks the REPLICATION attribute")
	// ErrNoFreeSlot means every replication slot of the server is in use.
	ErrNoFreeSlot = errors.New("cdc: no free replication slot")
	// ErrPublication means the publication exists but does not publish the
	// outbox table's inserts.
	ErrPublication = errors.New("cdc: the publication does not cover the outbox table")
	// ErrSlotActive means another process streams from the slot. Start
	// returns it at once, as a *SlotActiveError; the caller waits as a
	// standby and calls Start again later.
	ErrSlotActive = errors.New("cdc: the replication slot is active in another process")
	// ErrNoOutbox means the outbox table does not exist.
	ErrNoOutbox = errors.New("cdc: the outbox table does not exist")
	// ErrSlotMismatch means a slot of that name exists but cannot serve
	// this source (another plugin, another database, a physical slot).
	ErrSlotMismatch = errors.New("cdc: the replication slot belongs to something else")
)

// SlotActiveError is ErrSlotActive with the process that holds the slot.
type SlotActiveError struct {
	Slot string
	PID  int32
}

func (e *SlotActiveError) Error() string {
	return fmt.Sprintf("%v: slot %q is held by server process %d; another relay is streaming it, so this one waits as a standby (if that process is stale, end it with pg_terminate_backend(%d))",
		ErrSlotActive, e.Slot, e.PID, e.PID)
}

// Is makes errors.Is(err, ErrSlotActive) true.
func (e *SlotActiveError) Is(target error) bool { return target == ErrSlotActive }
